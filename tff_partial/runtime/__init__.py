"""Execution contexts: TFF's local C++ runtime, or several TFF C++ workers."""

from tff_partial.runtime.contexts import configure
from tff_partial.runtime.contexts import configured_workers
from tff_partial.runtime.contexts import create_context
from tff_partial.runtime.contexts import stop_local_workers_at_exit
from tff_partial.runtime.contexts import WorkerError
from tff_partial.runtime.local import LocalContext
from tff_partial.runtime.usage import ResourceUsage
from tff_partial.runtime.workers import is_loopback
from tff_partial.runtime.workers import local_workers
from tff_partial.runtime.workers import LocalWorker
from tff_partial.runtime.workers import LocalWorkers
from tff_partial.runtime.workers import REMOTE_RISK
from tff_partial.runtime.workers import start_worker
