"""tff_partial: partial-model federated learning building blocks for TFF.

Importing the package replaces TFF's import-time local C++ context by
`tff_partial.runtime.local.LocalContext`: the same runtime, with its worker
listening on 127.0.0.1 only and dying with this process (TFF's own listens on
every interface and outlives the program). A context set by the user is kept.
"""

from tff_partial.runtime import local as _local

_local.install_if_tff_default()
