"""BackgroundSaver: one write at a time, in a thread or inline; errors raised where looked for."""

from __future__ import annotations

import threading

import pytest

from octlm.trainer.saver import BackgroundSaver


def test_inline_saver_writes_before_submit_returns() -> None:
    saver = BackgroundSaver(background=False)
    done = []
    saver.submit(lambda: done.append(1))
    assert done == [1] and not saver.busy
    with pytest.raises(OSError, match="full"):
        saver.submit(lambda: (_ for _ in ()).throw(OSError("disk full")))
    saver.close()


def test_background_write_runs_while_the_caller_goes_on() -> None:
    saver = BackgroundSaver(background=True)
    release, done = threading.Event(), threading.Event()

    def write() -> None:
        release.wait(10)
        done.set()

    saver.submit(write)
    assert saver.busy and not done.is_set()  # submit returned with the write still held
    saver.check()  # never blocks on a write in flight
    release.set()
    saver.wait()
    assert done.is_set() and not saver.busy
    saver.close()


def test_a_second_submit_waits_for_the_first_write() -> None:
    saver = BackgroundSaver(background=True)
    order: list[str] = []
    gate = threading.Event()
    saver.submit(lambda: (gate.wait(10), order.append("first")))
    threading.Timer(0.2, gate.set).start()
    saver.submit(lambda: order.append("second"))  # blocks until the first is done
    assert order == ["first"]
    saver.close()  # close waits for the second
    assert order == ["first", "second"]


def test_a_failed_background_write_is_raised_by_check_wait_or_close() -> None:
    def fail() -> None:
        raise OSError(28, "No space left on device")

    for how in ("check", "wait", "close"):
        saver = BackgroundSaver(background=True)
        saver.submit(fail)
        while saver.busy:
            pass
        with pytest.raises(OSError, match="No space"):
            getattr(saver, how)()
        saver.check()  # raised once, then forgotten
        saver.close()
