"""Local adaptation of federated models (Yu, Bagdasaryan, Shmatikov 2020).

`strategies`: fine-tuning, freeze-base, EWC, knowledge distillation and the
from-scratch local baseline; `fisher`: the diagonal empirical Fisher for EWC;
`evaluation`: per-participant data and accuracies; `summary`: CSV and the
paper's summary numbers.
"""

from tff_partial.adaptation.evaluation import ParticipantData
from tff_partial.adaptation.evaluation import ParticipantEvaluator
from tff_partial.adaptation.evaluation import participant_data
from tff_partial.adaptation.fisher import EmpiricalFisher
from tff_partial.adaptation.fisher import empirical_fisher
from tff_partial.adaptation.strategies import ADAPTATION_STRATEGIES
from tff_partial.adaptation.strategies import LocalTrainer
from tff_partial.adaptation.strategies import StrategyConfig
from tff_partial.adaptation.strategies import TrainConfig
from tff_partial.adaptation.summary import summarize
