"""Federated select (Charles et al. 2022): keys, slicing, deselect, process."""

from tff_partial.select.aggregator import DeselectMeanFactory
from tff_partial.select.aggregator import DeselectMedianFactory
from tff_partial.select.keys import KeyPolicy
from tff_partial.select.keys import POLICIES
from tff_partial.select.process import build_federated_select_process
from tff_partial.select.process import client_input
from tff_partial.select.slicing import GroupConfig
from tff_partial.select.slicing import make_select_spec
from tff_partial.select.slicing import SelectSpec
