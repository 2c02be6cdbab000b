"""The process's DistributedOptimizers (each registers itself when it is built), for the module-level
calls that act on all of them (join, broadcast_parameters), and what becomes of those a script
never finished when it exits."""

import atexit
import weakref

from gradsync import _job

_OPTIMIZERS = []  # weak references, in creation order


def register(optimizer):
    _OPTIMIZERS.append(weakref.ref(optimizer))


def unfinished():
    """The live DistributedOptimizers that neither finish() nor join() ended, in creation order."""
    return [o for o in (ref() for ref in _OPTIMIZERS) if o is not None and not o._gs_finished]


def _end_at_exit():
    # A script that never calls finish() (Horovod's examples do not) ends training when it exits
    # (gradsync._job's exit handler calls this unless the program failed), as finish() would:
    # workers still training then fail at once, naming this one and join(), where they would
    # otherwise wait for its next push (PS) or its part of the next all-reduce. The first error
    # stops it: this worker then tells the scheduler it failed, with that error.
    for o in unfinished():
        o.finish(evaluate=False)


_job._exit_hooks.append(_end_at_exit)


@atexit.register
def _summaries_at_exit():
    # After a failure (or an end at exit that failed) the summaries of optimizers never finished.
    for o in unfinished():
        try:
            o._gs_write_summary()
        except Exception:  # noqa: BLE001 -- at exit, nothing to report to
            pass
