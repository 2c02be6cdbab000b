"""The one job this process belongs to (gradsync.init / shutdown)."""

import atexit
import sys

from gradsync import _native

GradsyncError = _native.GradsyncError

_job = None
_failure = None
_finished = False
# Called at exit, in order, before this worker tells the scheduler it is done, unless the program
# failed (an uncaught exception): gradsync.torch ends the training of optimizers never finished.
_exit_hooks = []


def init(args=None):
    """Joins the job, as gradsync-worker does, from gradsync-worker's flags: `args` (a list such
    as ["--mode=bsp", "--scheduler=127.0.0.1:7000"]) and the GRADSYNC_* environment variables
    (gradsync-launch and gradsync-run set them; the arguments win). The rank comes from --rank /
    GRADSYNC_RANK, else the launcher's (RANK from torchrun, OMPI_COMM_WORLD_RANK from mpirun,
    PMI_RANK, SLURM_PROCID in an srun step: the innermost first), else the scheduler assigns
    one. Without a mode the process trains alone (mode 'local'). Blocks until every worker of
    the job has joined. Raises ValueError for a bad setting or a refused registration (the
    message says which settings differ from the job's)."""
    global _job
    if _job is not None:
        raise ValueError("gradsync.init() was called already")
    argv = ["gradsync"] + [str(a) for a in (args or [])]
    _job = _native.Job(argv)
    atexit.register(_at_exit)
    previous_hook = sys.excepthook

    def hook(kind, value, tb):
        global _failure
        _failure = "%s: %s" % (kind.__name__, value)
        previous_hook(kind, value, tb)

    sys.excepthook = hook
    return _job


def job():
    """The native job; raises ValueError before init()."""
    if _job is None:
        raise ValueError("gradsync is not initialized: call gradsync.init() first")
    return _job


def is_initialized():
    return _job is not None


def rank():
    """This worker's rank in [0, size())."""
    return job().rank


def size():
    """The number of workers."""
    return job().size


def local_rank():
    """This worker's index among the job's workers on its host (by rank order; the host is the
    address each worker advertised)."""
    hosts = job().worker_hosts
    me = job().rank
    return sum(1 for r in range(me) if hosts[r] == hosts[me])


def local_size():
    """The number of the job's workers on this worker's host."""
    hosts = job().worker_hosts
    return hosts.count(hosts[job().rank])


def mode():
    """'local', 'bsp', 'ssp', 'asp' or 'allreduce'."""
    return job().mode


def staleness():
    """ssp: the job's staleness bound s; 0 in the other modes."""
    return job().staleness


def config():
    """Every training setting of the job (gradsync-worker's flags by field name: lr, batch,
    compress, error_feedback, overlap, seed, ...) as a dict, and the process settings under
    'process' (out, run, rank, ...)."""
    c = dict(job().config)
    c["process"] = dict(job().process)
    return c


def shutdown(error=None):
    """Tells the scheduler this worker is done (with `error`, that it failed). Called at exit if
    the program does not; idempotent."""
    global _finished
    if _job is None or _finished:
        return
    _finished = True
    _job.finished(error or "")


def _at_exit():
    # Registered by init(), after gradsync.torch's own atexit handler was (at import), so this runs
    # first (atexit is last in, first out): training ends before anything else is torn down.
    error = _failure
    if error is None and not _finished:
        for hook in _exit_hooks:
            try:
                hook()
            except Exception as e:  # noqa: BLE001 -- at exit: said here, and to the scheduler
                error = "%s: %s" % (type(e).__name__, e)
                print("gradsync: worker %d: at exit: %s" % (_job.rank, error), file=sys.stderr, flush=True)
    shutdown(error)


class trace_span:
    """A span of your own code in this process's timeline (gradsync-launch --trace, or a spec's
    `trace: true`): data loading, evaluation, anything between the frontend's own spans.

        with gs.trace_span("load batch"):
            x, y = next(loader)

    Records nothing when the job is not traced; costs a call to the clock when it is.
    """

    def __init__(self, name, category="user"):
        self.name = name
        self.category = category
        self._begin = None

    def __enter__(self):
        self._begin = _native.trace_now_us() if _native.trace_on() else None
        return self

    def __exit__(self, *exc):
        if self._begin is not None:
            _native.trace_complete(self.name, self.category, self._begin)
        return False
