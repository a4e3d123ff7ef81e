"""Privacy and robustness: DP-FTRL, DP-FedAvg, coordinate-wise median, accounting."""

from tff_partial.privacy.accounting import dp_fedavg_epsilon
from tff_partial.privacy.accounting import dp_fedavg_event
from tff_partial.privacy.accounting import dp_ftrl_epsilon
from tff_partial.privacy.accounting import dp_ftrl_event
from tff_partial.privacy.dp_fedavg import build_dp_gaussian_factory
from tff_partial.privacy.dp_fedavg import GaussianSumFactory
from tff_partial.privacy.dp_ftrl import build_dp_ftrl_factory
from tff_partial.privacy.dp_ftrl import build_dp_ftrl_server_optimizer
from tff_partial.privacy.dp_ftrl import DPFTRLFactory
from tff_partial.privacy.dp_ftrl import DPFTRLSumFactory
from tff_partial.privacy.dp_ftrl import rounds_per_epoch
from tff_partial.privacy.dp_mean import DPMeanFactory
from tff_partial.privacy.dp_mean import DPSumFactory
from tff_partial.privacy.median import build_median_factory
from tff_partial.privacy.median import CoordinateMedianFactory
from tff_partial.privacy.median import masked_median
from tff_partial.privacy.sampling import build_epoch_sampler
from tff_partial.privacy.statistics import statistic_of
