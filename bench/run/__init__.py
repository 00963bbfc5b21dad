"""Runs in the background: the task state machine (:mod:`~bench.run.task`), a run as a
:class:`~bench.run.job.Job`, its execution (:mod:`~bench.run.execute`: measure, profile, finish),
the recorder (:mod:`~bench.run.recorder`), the engine host that keeps an in-process model in a
child process (:mod:`~bench.run.engine_host`), host load and GC pauses during a run, and at the
top :func:`~bench.run.manager.start_run` and :class:`~bench.run.manager.JobManager`."""
