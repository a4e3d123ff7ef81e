"""PVT: Partial Variable Training (Yang et al.), see docs/pvt.md.

Variable typing (`variable_types`), mask schemes (`schemes`), the masked mean
aggregator (`masked_mean`), the client work (`client_work`) and
`build_pvt_process` (`process`).
"""

from tff_partial.masks.masked_mean import MaskedMeanFactory
from tff_partial.masks.masked_median import MaskedMedianFactory
from tff_partial.masks import client_work
from tff_partial.masks.client_work import client_input
from tff_partial.masks.process import build_masked_finalizer
from tff_partial.masks.process import build_pvt_process
from tff_partial.masks.schemes import MaskSampler
from tff_partial.masks.schemes import SCHEMES
from tff_partial.masks.variable_types import classify_variables
from tff_partial.masks.variable_types import VariableType
