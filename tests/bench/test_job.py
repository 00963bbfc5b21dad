"""BackgroundTask, the one state machine behind runs, the engine slot and the compare task."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import ClassVar

import pytest

from bench.run.task import BackgroundTask, TaskState, TransitionError, error_reason
from engines.errors import ConfigError

WAIT_S = 10.0


def test_allowed_transitions_move_status_phase_and_error() -> None:
    task = BackgroundTask("t")
    assert task.status == "pending" and task.active and not task.finished()
    task.transition("loading", phase="loading model")
    task.transition("running")
    assert (task.status, task.state().phase) == ("running", "running")  # the phase defaults to the status
    task.transition("failed", error="boom")
    state = task.state()
    assert (state.status, state.error, state.active) == ("failed", "boom", False)
    assert state.since >= state.created_at


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ((), "pending-is-not-a-status"),
        (("running",), "loading"),  # no way back
        (("running", "completed"), "running"),  # a final status is final
        (("cancelled",), "failed"),
    ],
)
def test_refused_transitions_raise_and_leave_the_task_as_it_was(path: tuple[str, ...], refused: str) -> None:
    task = BackgroundTask("t")
    for status in path:
        task.transition(status)
    before = task.state()
    with pytest.raises(TransitionError, match=f"t: cannot go from {before.status} to {refused}"):
        task.transition(refused, error="never set")
    assert task.state() == before


def test_transition_refuses_a_field_the_task_does_not_have() -> None:
    task = BackgroundTask("t")
    with pytest.raises(TypeError, match="no field"):
        task.transition("running", nonsense=1)
    assert task.status == "pending"


def test_report_clamps_the_fraction() -> None:
    task = BackgroundTask("t")
    task.report("half way", 0.5)
    assert (task.state().phase, task.fraction) == ("half way", 0.5)
    task.report("over", 7)
    assert task.fraction == 1.0
    task.report("under", -1)
    assert task.fraction == 0.0


def test_a_target_that_ends_its_task_keeps_its_status() -> None:
    task = BackgroundTask("t")
    task.start(lambda: task.transition("completed"))
    assert task.join(WAIT_S) and task.finished()
    assert task.status == "completed" and task.error is None


def test_a_target_that_returns_without_ending_its_task_is_marked_failed_with_a_reason() -> None:
    task = BackgroundTask("t")
    task.start(lambda: task.transition("running"))
    assert task.join(WAIT_S)
    assert task.status == "failed" and task.error == "the task ended without a result"


def test_a_target_that_set_an_error_keeps_it_as_the_reason() -> None:
    task = BackgroundTask("t")
    task.start(lambda: task.set_error("the engine died"))
    assert task.join(WAIT_S)
    assert (task.status, task.error) == ("failed", "the engine died")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_target_that_raises_is_marked_failed_with_the_exception_as_one_line() -> None:
    task = BackgroundTask("t")

    def target() -> None:
        raise ValueError("bad\nvalue")

    task.start(target)
    assert task.join(WAIT_S)
    assert task.thread is not None
    task.thread.join(WAIT_S)  # the traceback reaches threading.excepthook (here: pytest's warning) in this test
    assert (task.status, task.error) == ("failed", "ValueError: bad value")


def test_a_task_starts_once() -> None:
    task = BackgroundTask("t")
    task.start(lambda: task.transition("completed"))
    with pytest.raises(TransitionError, match="already started"):
        task.start(lambda: None)
    assert task.join(WAIT_S)


def test_cancel_sets_the_event_the_worker_stops_on_and_join_waits_for_it() -> None:
    task = BackgroundTask("t")
    started = threading.Event()

    def target() -> None:
        task.transition("running")
        started.set()
        task.cancel_event.wait(WAIT_S)
        task.transition("cancelled" if task.cancel_event.is_set() else "completed")

    task.start(target)
    assert started.wait(WAIT_S)
    assert not task.join(0.05) and not task.finished()  # still running: join times out
    task.cancel()
    assert task.join(WAIT_S) and task.finished()
    assert task.status == "cancelled" and not task.active


def test_status_read_from_another_thread_while_the_worker_runs() -> None:
    task = BackgroundTask("t")
    at_running, go_on = threading.Event(), threading.Event()

    def target() -> None:
        task.transition("running", phase="step 1")
        task.report("step 1", 0.25)
        at_running.set()
        go_on.wait(WAIT_S)
        task.transition("completed")

    task.start(target)
    assert at_running.wait(WAIT_S)
    seen: list[TaskState] = []
    reader = threading.Thread(target=lambda: seen.append(task.state()))
    reader.start()
    reader.join(WAIT_S)
    assert [(s.status, s.phase, s.fraction, s.active) for s in seen] == [("running", "step 1", 0.25, True)]
    go_on.set()
    assert task.join(WAIT_S)
    assert task.state().status == "completed"


def test_a_subclass_has_its_own_statuses() -> None:
    class Op(BackgroundTask):
        TRANSITIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {
            "pending": ("stopping", "failed"),
            "stopping": ("empty", "failed"),
            "empty": (),
            "failed": (),
        }
        ACTIVE: ClassVar[tuple[str, ...]] = ("pending", "stopping")

    op = Op("op")
    with pytest.raises(TransitionError):
        op.transition("running")
    op.start(lambda: op.transition("stopping"))  # forgets to end: lands on FAILED
    assert op.join(WAIT_S) and op.status == "failed"


@pytest.mark.parametrize(
    ("transitions", "active", "match"),
    [
        ({"pending": ("done",), "done": (), "failed": ()}, ("pending",), "must be able to go to 'failed'"),
        ({"pending": ("failed",), "failed": ("pending",)}, ("pending",), "must be final"),
        ({"pending": ("failed", "nowhere"), "failed": ()}, ("pending",), "does not list"),
        ({"start": ("failed",), "failed": ()}, ("start",), "initial 'pending'"),
    ],
)
def test_a_state_machine_a_dying_worker_could_stick_in_is_refused_at_definition(
    transitions: dict[str, tuple[str, ...]], active: tuple[str, ...], match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        type("Bad", (BackgroundTask,), {"TRANSITIONS": transitions, "ACTIVE": active})


def test_error_reason_is_one_line() -> None:
    assert error_reason(ConfigError("too\n  many  spaces")) == "too many spaces"
    assert error_reason(KeyError("x")) == "KeyError: 'x'"
