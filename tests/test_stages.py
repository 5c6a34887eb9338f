"""Each stage on its own, driven through its streams: what it emits, end of stream, backpressure, cancellation.

Stages are plain coroutines over anyio memory-object streams, so each test wires one stage to streams it
holds itself: it feeds records, reads (or refuses to read) what comes out, closes the input and cancels.
Records come from the real executor on the toy task; stores are real (Zarr staging, SQLite catalog).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import numpy as np
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import toy_tasks
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.stages.commit import commit_stage
from demoforge.stages.context import StageContext
from demoforge.stages.camera_encoder import EncoderError
from demoforge.stages.encode import encode_stage
from demoforge.stages.executor import RangeWorkSource, Executor
from demoforge.stages.plan import EpisodePlanner
from demoforge.stages.records import (
    AttemptEnded,
    AttemptStarted,
    EncodedFrame,
    EpisodeAbandoned,
    EpisodeAssignment,
    Frame,
    Record,
    StagedAttempt,
    VideoTail,
)
from demoforge.stages.recipe import WorkerRecipe
from demoforge.stages.step import StepSettings, step_stage
from demoforge.stages.write import write_stage
from demoforge.storage.catalog import ResumeState
from demoforge.storage.schema import CameraSpec
from demoforge.storage.store import Store, open_store
from helpers import decode_frames, psnr

pytestmark = pytest.mark.anyio

H264 = VideoSettings(codec="h264")
SIZE, STEPS = 16, 6
OPTIONS = {**toy_tasks.DEFAULTS, "size": SIZE, "steps": STEPS}
INFO = toy_tasks.describe(OPTIONS)
NOTHING = ResumeState(frozenset(), {})


def toy_records(episodes: int, *, start: int = 0, fail_every: int = 0, max_attempts: int = 3) -> list:
    """The executor's records of toy episodes ``start..start+episodes-1`` (fail_every=1: every attempt fails)."""
    env = toy_tasks.CameraPointEnv({**OPTIONS, "fail_every": fail_every})
    try:
        return list(Executor(env, task="toy-point", max_attempts=max_attempts).run(RangeWorkSource(episodes, start)))
    finally:
        env.close()


def failed_episode() -> list:
    """Episode 10, whose only allowed attempt fails: never committable, then abandoned."""
    return toy_records(1, start=10, fail_every=1, max_attempts=1)


async def drain(receive) -> list:
    async with receive:
        return [item async for item in receive]


def open_job_store(path) -> Store:
    spec = JobSpec(task="toy-point", episodes=1, video=H264, task_options={"size": SIZE, "steps": STEPS})
    return open_store(path, "w", fingerprint=spec.fingerprint())


# ----------------------------------------------------------------------------------------------- plan
async def test_plan_hands_out_the_target_then_waits_and_ends_when_all_are_committed():
    planner = EpisodePlanner(3, NOTHING, max_attempts=3)
    send, receive = anyio.create_memory_object_stream[EpisodeAssignment](0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(planner.run, send)
        got = [await receive.receive() for _ in range(3)]
        assert got == [EpisodeAssignment(0, 0), EpisodeAssignment(1, 0), EpisodeAssignment(2, 0)]
        with anyio.move_on_after(0.2) as waited:  # target reached by in-flight episodes: nothing more
            await receive.receive()
        assert waited.cancelled_caught
        planner.finished(1, committed=False)  # an abandoned episode frees its slot for a new index
        assert await receive.receive() == EpisodeAssignment(3, 0)
        for index in (0, 2, 3):
            planner.finished(index, committed=True)
        with pytest.raises(anyio.EndOfStream):  # done: the stage closes its stream
            await receive.receive()
    assert planner.done and planner.abandoned == {1}


async def test_plan_resumes_past_committed_and_exhausted_episodes_with_their_spent_attempts():
    resume = ResumeState(committed=frozenset({0, 2}), spent_attempts={1: 2, 3: 3}, quarantined=frozenset({4}))
    planner = EpisodePlanner(5, resume, max_attempts=3)
    send, receive = anyio.create_memory_object_stream[EpisodeAssignment](0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(planner.run, send)
        got = [await receive.receive() for _ in range(3)]
        planner.stop()
    assert got == [EpisodeAssignment(1, 2), EpisodeAssignment(5, 0), EpisodeAssignment(6, 0)]


async def test_plan_offers_one_episode_at_a_time_and_pause_withdraws_the_offer():
    planner = EpisodePlanner(10, NOTHING, max_attempts=3)
    send, receive = anyio.create_memory_object_stream[EpisodeAssignment](0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(planner.run, send)
        await anyio.wait_all_tasks_blocked()
        # Backpressure: with nobody receiving, one offer waits and nothing else is planned.
        assert send.statistics().tasks_waiting_send == 1 and planner.in_flight == {0}
        planner.set_paused(True)
        await anyio.wait_all_tasks_blocked()
        assert send.statistics().tasks_waiting_send == 0 and planner.in_flight == set()
        with anyio.move_on_after(0.1) as waited:
            await receive.receive()
        assert waited.cancelled_caught
        planner.set_paused(False)
        assert await receive.receive() == EpisodeAssignment(0, 0)  # the withdrawn index is offered again
        planner.stop()
        with pytest.raises(anyio.EndOfStream):
            await receive.receive()


async def test_plan_stops_when_every_worker_is_gone():
    planner = EpisodePlanner(10, NOTHING, max_attempts=3)
    send, receive = anyio.create_memory_object_stream[EpisodeAssignment](0)
    receive.close()
    with anyio.fail_after(5):
        await planner.run(send)
    assert planner.in_flight == set()


# ----------------------------------------------------------------------------------------------- step
def step_env_factory(steps_taken: list[int] | None = None):
    class Counting(toy_tasks.CameraPointEnv):
        def step(self, action):
            if steps_taken is not None:
                steps_taken.append(1)
            return super().step(action)

    return lambda: Counting(dict(OPTIONS))


def step_task(env_factory, assignments, send, stop, **extra):
    """The step stage on toy-point envs from ``env_factory``, as a task group's callable. Its encoders keep
    up with the env (``encode_lag=0``) unless a test says otherwise."""
    extra = {"encode_lag": 0, **extra}
    recipe = WorkerRecipe(task="toy-point", job_seed=0, max_attempts=3, cameras=INFO.cameras, fps=INFO.fps,
                          video=H264)
    settings = StepSettings(recipe, **extra)
    return lambda: step_stage(0, env_factory, settings, assignments, send, StageContext(stop=stop))


def one_episode() -> MemoryObjectReceiveStream[EpisodeAssignment]:
    """A plan that assigns episode 0 and ends."""
    send, receive = anyio.create_memory_object_stream[EpisodeAssignment](1)
    send.send_nowait(EpisodeAssignment(0))
    send.close()
    return receive


async def until(condition: Callable[[], bool]) -> None:
    """Wait for a condition another thread makes true (an env worker's or an encoder lane's): checked every
    10 ms; the caller's ``fail_after`` catches a hang. Conditions of tasks alone use
    ``anyio.wait_all_tasks_blocked()`` instead."""
    while not condition():
        await anyio.sleep(0.01)


def env_thread_waits_in(function: str) -> bool:
    """Whether an env worker thread is inside ``function`` now (its current stack, as py-spy would show it)."""
    import sys
    import traceback

    threads = {t.ident: t.name for t in threading.enumerate()}
    return any(threads.get(ident, "").startswith("env-worker-")
               and any(f.name == function for f in traceback.extract_stack(frame))
               for ident, frame in sys._current_frames().items())


async def until_send_blocks(send: MemoryObjectSendStream) -> None:
    """Until a send waits on the full stream: the env thread that issued it is blocked inside that send."""
    await until(lambda: send.statistics().tasks_waiting_send > 0)


async def test_step_runs_assigned_episodes_and_ends_its_stream_when_the_plan_does():
    assign_send, assign_recv = anyio.create_memory_object_stream[EpisodeAssignment](0)
    send, receive = anyio.create_memory_object_stream[object](8)
    stop = threading.Event()

    async def plan() -> None:
        async with assign_send:
            for index in (4, 7):
                await assign_send.send(EpisodeAssignment(index, 1))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(plan)
            tg.start_soon(step_task(step_env_factory(), assign_recv, send, stop))
            records = await drain(receive)
    started = [r for r in records if isinstance(r, AttemptStarted)]
    ended = [r for r in records if isinstance(r, AttemptEnded)]
    assert [(r.key.episode_index, r.key.attempt) for r in started] == [(4, 1), (7, 1)]
    assert [r.result.committable for r in ended] == [True, True] and [r.frames for r in ended] == [STEPS] * 2
    # The worker encoded its own frames: each episode's video decodes to its frames.
    for key in (r.key for r in started):
        frames = [r for r in records if isinstance(r, EncodedFrame) and r.key == key]
        (tail,) = [r for r in records if isinstance(r, VideoTail) and r.key == key]
        assert len(frames) == STEPS
        for camera in INFO.cameras:
            data = b"".join(f.video[camera.name] for f in frames) + tail.video[camera.name]
            assert len(decode_frames(data)) == STEPS


@asynccontextmanager
async def step_blocked_on_a_full_stream(steps_taken: list[int]) -> AsyncIterator[MemoryObjectReceiveStream]:
    """The step stage running one episode into a stream of 3, once its env thread waits inside a send; yields
    the stream's receiving end, and leaves when the stage has ended."""
    send, receive = anyio.create_memory_object_stream[object](3)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(step_task(step_env_factory(steps_taken), one_episode(), send, threading.Event()))
            await until_send_blocks(send)
            yield receive


async def test_step_blocks_on_a_full_stream_so_the_env_waits_for_the_consumer() -> None:
    steps_taken: list[int] = []
    async with step_blocked_on_a_full_stream(steps_taken) as receive:
        # Full: 3 records queued (AttemptStarted + 2 frames), a 4th waits in send, the env stopped there.
        assert receive.statistics().current_buffer_used == 3
        assert len(steps_taken) == 3
        records = await drain(receive)
    assert len(steps_taken) == STEPS and sum(isinstance(r, EncodedFrame) for r in records) == STEPS


async def test_step_ends_quietly_when_the_next_stage_is_gone() -> None:
    """The stage after it failed (its receiving end closed while the env waits to send): the step stage stops
    its env and ends without an error of its own, so the job reports only the failure that caused it."""
    steps_taken: list[int] = []
    async with step_blocked_on_a_full_stream(steps_taken) as receive:
        receive.close()  # what a failing next stage does as it ends
    assert len(steps_taken) < STEPS  # it stopped stepping: nothing would take what it makes


async def test_step_sends_records_in_batches_and_runs_at_most_a_batch_ahead_of_a_full_stream() -> None:
    send, receive = anyio.create_memory_object_stream[object](1)
    steps_taken: list[int] = []
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(step_task(step_env_factory(steps_taken), one_episode(), send, threading.Event(),
                                    send_batch=4, send_wait_s=60))
            await until_send_blocks(send)
            # One batch (AttemptStarted + 3 frames) went out in one hand-off: the first record fills the
            # stream, the second waits in send, and the env stopped after the batch's 3 steps.
            assert receive.statistics().current_buffer_used == 1
            assert len(steps_taken) == 3
            records = await drain(receive)
    # The last, partial batch is sent when the plan runs dry; order is the executor's.
    assert [type(r).__name__ for r in records] == (["AttemptStarted"] + ["EncodedFrame"] * STEPS
                                                   + ["VideoTail", "AttemptEnded"])
    assert [r.step for r in records if isinstance(r, EncodedFrame)] == list(range(STEPS))


def hold_encoders(monkeypatch) -> threading.Event:
    """Every camera encoder waits inside ``encode`` until the returned event is set."""
    from demoforge.stages import camera_encoder

    release = threading.Event()
    plain = camera_encoder.CameraEncoder.encode

    def held(self, image):
        release.wait(60)
        return plain(self, image)

    monkeypatch.setattr(camera_encoder.CameraEncoder, "encode", held)
    return release


async def test_step_waits_for_its_encoders_once_it_is_encode_lag_jobs_ahead(monkeypatch) -> None:
    """A slow encoder slows the env: the worker runs at most ``encode_lag`` jobs ahead of its encoders."""
    release = hold_encoders(monkeypatch)
    send, receive = anyio.create_memory_object_stream[object](100)
    steps_taken: list[int] = []
    lag = 3
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(step_task(step_env_factory(steps_taken), one_episode(), send, threading.Event(),
                                    encode_lag=lag))
            # The env thread waits inside the encoders' take_result: after the (lag + 1)-th step, for the first
            # frame's bytes; nothing but AttemptStarted went downstream.
            await until(lambda: env_thread_waits_in("take_result"))
            assert len(steps_taken) == lag + 1
            assert receive.statistics().current_buffer_used <= 1
            release.set()
            records = await drain(receive)
    assert len(steps_taken) == STEPS and sum(isinstance(r, EncodedFrame) for r in records) == STEPS


async def test_step_starts_the_next_episode_while_its_encoders_finish_the_last(monkeypatch) -> None:
    """Work already assigned is taken without draining the encoders: the env steps into episode 1 while not
    one frame of episode 0 is encoded yet (it used to wait there for the whole attempt's video)."""
    release = hold_encoders(monkeypatch)
    assign_send, assign_recv = anyio.create_memory_object_stream[EpisodeAssignment](2)
    for index in (0, 1):
        assign_send.send_nowait(EpisodeAssignment(index))
    assign_send.close()
    send, receive = anyio.create_memory_object_stream[object](100)
    steps_taken: list[int] = []
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(step_task(step_env_factory(steps_taken), assign_recv, send, threading.Event(),
                                    encode_lag=4 * STEPS))
            await until(lambda: len(steps_taken) > STEPS)  # a step of episode 1, episode 0 not encoded
            release.set()
            records = await drain(receive)
    ended = [r.key.episode_index for r in records if isinstance(r, AttemptEnded)]
    assert ended == [0, 1] and sum(isinstance(r, EncodedFrame) for r in records) == 2 * STEPS


async def test_step_stop_ends_in_flight_attempts_as_interrupted():
    assign_send, assign_recv = anyio.create_memory_object_stream[EpisodeAssignment](1)
    send, receive = anyio.create_memory_object_stream[object](100)
    stop = threading.Event()
    await assign_send.send(EpisodeAssignment(0))
    long_env = lambda: toy_tasks.CameraPointEnv({**OPTIONS, "steps": 10_000})  # noqa: E731
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(step_task(long_env, assign_recv, send, stop))
            first = await receive.receive()
            assert isinstance(first, AttemptStarted)
            stop.set()
            records = [first, *await drain(receive)]
    assign_send.close()
    (ended,) = [r for r in records if isinstance(r, AttemptEnded)]
    assert ended.result.terminal_reason.value == "interrupted" and not ended.result.committable
    assert ended.frames == sum(isinstance(r, EncodedFrame) for r in records) < 10_000


def fed(records: list) -> MemoryObjectReceiveStream:
    """A stage's input stream holding ``records``, then its end."""
    send, receive = anyio.create_memory_object_stream[object](len(records) + 1)
    for record in records:
        send.send_nowait(record)
    send.close()
    return receive


# --------------------------------------------------------------------------------------------- encode
async def run_encode(records: list, buffer: int = 100) -> list:
    in_recv = fed(records)
    out_send, out_recv = anyio.create_memory_object_stream[object](buffer)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: encode_stage(in_recv, out_send, cameras=INFO.cameras, fps=INFO.fps, settings=H264))
            out = await drain(out_recv)
    return out


async def test_encode_turns_frames_into_video_flushes_committed_attempts_and_drops_discarded_ones():
    records = toy_records(3)
    failed = failed_episode()
    out = await run_encode(records + failed)
    encoded = [r for r in out if isinstance(r, EncodedFrame)]
    tails = [r for r in out if isinstance(r, VideoTail)]
    assert len(encoded) == sum(isinstance(r, Frame) for r in records + failed)
    # A tail (the encoder's flush) right before each committable attempt's end, none for the failed one.
    ends = [i for i, r in enumerate(out) if isinstance(r, AttemptEnded)]
    assert [out[i - 1].key for i in ends if out[i].result.committable] == [t.key for t in tails]
    assert [t.key.episode_index for t in tails] == [0, 1, 2]
    # Everything else passes through in order (started, ended, abandoned).
    others = [r for r in out if not isinstance(r, (EncodedFrame, VideoTail))]
    assert others == [r for r in records + failed if not isinstance(r, Frame)]
    # The bytes of one attempt are one decodable video of its frames.
    key = tails[1].key
    video = b"".join(r.video["cam"] for r in encoded if r.key == key) + tails[1].video["cam"]
    decoded = decode_frames(video)
    originals = [r.images["cam"] for r in records if isinstance(r, Frame) and r.key == key]
    assert len(decoded) == len(originals) == STEPS
    assert min(psnr(a, b) for a, b in zip(decoded, originals)) > 30


async def test_encode_refuses_a_frame_with_undeclared_cameras():
    frame = next(r for r in toy_records(1) if isinstance(r, Frame))
    odd = Frame(frame.key, frame.step, frame.state, frame.action, frame.reward, frame.annotations,
                images={"other": frame.images["cam"]})
    with pytest.RaisesGroup(pytest.RaisesExc(EncoderError, match=r"cameras \['other'\]; the job declares \['cam'\]")):
        await run_encode([odd])


async def test_encode_waits_for_its_consumer_and_can_be_cancelled_mid_attempt():
    records = toy_records(1)
    in_send, in_recv = anyio.create_memory_object_stream[Record](len(records))
    out_send, out_recv = anyio.create_memory_object_stream[object](0)
    for record in records:
        in_send.send_nowait(record)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: encode_stage(in_recv, out_send, cameras=INFO.cameras, fps=INFO.fps,
                                               settings=H264, lookahead=4))
            first = await out_recv.receive()
            second = await out_recv.receive()
            assert isinstance(first, AttemptStarted) and isinstance(second, EncodedFrame)
            await until(lambda: out_send.statistics().tasks_waiting_send == 1)
            await anyio.wait_all_tasks_blocked()  # the feeder too: at its lookahead, or still taking records
            # Nobody reads: the stage holds one encoded frame in send, has taken its lookahead of records
            # in all and takes nothing more.
            assert out_send.statistics().tasks_waiting_send == 1
            assert in_send.statistics().current_buffer_used == len(records) - 2 - 4
            tg.cancel_scope.cancel()  # mid-attempt: its encoders are aborted, its streams closed
    with pytest.raises(anyio.EndOfStream):
        await out_recv.receive()
    with pytest.raises(anyio.BrokenResourceError):
        await in_send.send(records[-1])


def two_camera_records() -> tuple[tuple[CameraSpec, ...], list]:
    """One toy episode whose frames carry two cameras, "fast" and "slow" (different images)."""
    cameras = (CameraSpec("fast", SIZE, SIZE), CameraSpec("slow", SIZE, SIZE))
    out = []
    for r in toy_records(1):
        if isinstance(r, Frame):
            image = r.images["cam"]
            r = Frame(r.key, r.step, r.state, r.action, r.reward, r.annotations,
                      images={"fast": image, "slow": np.ascontiguousarray(image[::-1])})
        out.append(r)
    return cameras, out


async def test_encode_cameras_run_independently_and_records_leave_in_order(monkeypatch) -> None:
    from demoforge.stages import camera_encoder

    cameras, records = two_camera_records()
    release = threading.Event()
    encoded: dict[str, int] = {"fast": 0, "slow": 0}
    real = camera_encoder.CameraEncoder.encode

    def gated(self, image):
        if self.camera.name == "slow":
            assert release.wait(30), "the test never released the slow camera"
        encoded[self.camera.name] += 1
        return real(self, image)

    monkeypatch.setattr(camera_encoder.CameraEncoder, "encode", gated)
    in_recv = fed(records)
    out_send, out_recv = anyio.create_memory_object_stream[object](100)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: encode_stage(in_recv, out_send, cameras=cameras, fps=INFO.fps, settings=H264,
                                               lookahead=STEPS + 2))
            await until(lambda: encoded["fast"] >= STEPS)  # the fast camera encodes every frame; "slow" is stuck
            assert encoded["slow"] == 0
            # A frame leaves only when all its cameras are done: nothing but the attempt's start so far.
            assert [type(r).__name__ for r in [await out_recv.receive()]] == ["AttemptStarted"]
            assert out_recv.statistics().current_buffer_used == 0
            release.set()
            out = await drain(out_recv)
    assert [type(r).__name__ for r in out] == ["EncodedFrame"] * STEPS + ["VideoTail", "AttemptEnded"]
    assert [r.step for r in out[:STEPS]] == list(range(STEPS))
    frames = [r for r in records if isinstance(r, Frame)]
    for name in ("fast", "slow"):
        video = b"".join(r.video[name] for r in out[:STEPS]) + out[STEPS].video[name]
        decoded = decode_frames(video)
        assert len(decoded) == STEPS  # each camera's frames in exact order
        assert min(psnr(d, f.images[name]) for d, f in zip(decoded, frames)) > 30


async def test_encode_surfaces_an_encoder_failure_in_a_camera_lane(monkeypatch):
    from demoforge.stages import camera_encoder

    real = camera_encoder.CameraEncoder.encode

    def failing(self, image):
        if self.frames == 3:
            raise EncoderError(f"camera {self.camera.name!r} frame 3: simulated")
        return real(self, image)

    monkeypatch.setattr(camera_encoder.CameraEncoder, "encode", failing)
    with pytest.RaisesGroup(pytest.RaisesExc(EncoderError, match="frame 3: simulated")):
        await run_encode(toy_records(2))


# ---------------------------------------------------------------------------------------------- write
async def run_write(store: Store, records: list) -> list:
    in_recv = fed(records)
    out_send, out_recv = anyio.create_memory_object_stream[object](100)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: write_stage(in_recv, out_send, store=store))
            out = await drain(out_recv)
    return out


async def test_write_stages_committable_attempts_and_passes_discarded_ones_through(tmp_path):
    encoded = await run_encode(toy_records(2) + failed_episode())
    store = open_job_store(tmp_path / "store")
    try:
        out = await run_write(store, encoded)
        staged = [r for r in out if isinstance(r, StagedAttempt)]
        assert [(s.ended.key.episode_index, s.ended.result.committable) for s in staged] == \
            [(0, True), (1, True), (10, False)]
        assert store.staging is not None
        for item in staged[:2]:
            assert item.content_hash and item.video_bytes["cam"] > 0
            episode = store.staging.read_episode(item.ended.key.episode_id, item.ended.frames, item.video_bytes)
            assert episode.content_hash() == item.content_hash and len(episode.reward) == STEPS
        assert staged[2].video_bytes == {} and staged[2].content_hash is None
        # Every attempt has its catalog row, still staging: only the commit stage decides.
        assert {r.state for r in store.attempts()} == {"staging"} and len(store.attempts()) == 3
        assert [r for r in out if not isinstance(r, StagedAttempt)] == \
            [r for r in encoded if isinstance(r, EpisodeAbandoned)]
    finally:
        store.close()


async def test_write_refuses_an_attempt_whose_frame_count_disagrees(tmp_path):
    encoded = await run_encode(toy_records(1))
    ended = next(r for r in encoded if isinstance(r, AttemptEnded))
    tampered = [AttemptEnded(ended.key, ended.result, ended.frames + 1) if r is ended else r for r in encoded]
    store = open_job_store(tmp_path / "store")
    try:
        with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match=f"write stage saw {STEPS} frames, the "
                                                                     f"executor emitted {STEPS + 1}")):
            await run_write(store, tampered)
    finally:
        store.close()


async def test_write_keeps_taking_records_while_its_io_is_slow_up_to_its_io_queue(tmp_path, monkeypatch):
    from demoforge.storage import staging as staging_mod

    records = await run_encode(toy_records(3))
    release = threading.Event()
    real_create = staging_mod.EpisodeWriter.create

    def slow_create(self):
        assert release.wait(30), "the test never released the disk"
        return real_create(self)

    monkeypatch.setattr(staging_mod.EpisodeWriter, "create", slow_create)
    store = open_job_store(tmp_path / "store")
    try:
        in_recv = fed(records)
        out_send, out_recv = anyio.create_memory_object_stream[object](100)
        per_attempt = len(records) // 3
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: write_stage(in_recv, out_send, store=store,
                                                  io_queue=2))
                await anyio.wait_all_tasks_blocked()
                # The first attempt's arrays are still being created, yet its frames were all buffered; I/O
                # jobs: its opening (running), its last chunks (queued), the next opening (waiting to queue).
                assert in_recv.statistics().current_buffer_used == len(records) - per_attempt - 1
                assert out_recv.statistics().current_buffer_used == 0
                release.set()
                out = await drain(out_recv)
        assert [s.ended.key.episode_index for s in out] == [0, 1, 2]
        assert store.staging is not None
        for item in out:
            episode = store.staging.read_episode(item.ended.key.episode_id, item.ended.frames, item.video_bytes)
            assert episode.content_hash() == item.content_hash
    finally:
        store.close()


# --------------------------------------------------------------------------------------------- commit
async def test_commit_commits_discards_and_reports_each_outcome_to_the_planner(tmp_path) -> None:
    records = toy_records(2) + failed_episode()
    store = open_job_store(tmp_path / "store")
    try:
        staged = await run_write(store, await run_encode(records))
        planner = EpisodePlanner(2, NOTHING, max_attempts=1)
        planner.in_flight.update({0, 1, 10})
        seen: list[StagedAttempt] = []
        send, receive = anyio.create_memory_object_stream[StagedAttempt | EpisodeAbandoned](len(staged))
        for item in staged:
            send.send_nowait(item)
        send.close()
        with anyio.fail_after(60):
            await commit_stage(receive, store=store, planner=planner,
                               on_outcome=seen.append)
        assert [s.ended.result.committable for s in seen] == [True, True, False]
        rows = {r.episode_id: r for r in store.attempts()}
        committed = [s.ended.key.episode_id for s in seen[:2]]
        assert [rows[e].state for e in committed] == ["committed", "committed"]
        assert [rows[e].content_hash for e in committed] == [s.content_hash for s in seen[:2]]
        discarded = seen[2].ended.key.episode_id
        assert store.staging is not None
        assert rows[discarded].state == "discarded" and discarded not in store.staging.episode_ids()
        # The abandoned episode and both commits reached the planner: it is done.
        assert planner.committed == {0, 1} and planner.abandoned == {10}
        assert planner.done and planner.in_flight == set()
    finally:
        store.close()


async def test_commit_stops_at_end_of_stream_and_on_cancellation_without_committing_half(tmp_path):
    store = open_job_store(tmp_path / "store")
    try:
        staged = await run_write(store, await run_encode(toy_records(1)))
        planner = EpisodePlanner(5, NOTHING, max_attempts=3)
        send, receive = anyio.create_memory_object_stream[StagedAttempt | EpisodeAbandoned](10)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: commit_stage(receive, store=store,
                                                   planner=planner))
                await anyio.wait_all_tasks_blocked()
                tg.cancel_scope.cancel()  # waiting for input: cancelled, nothing half done
        assert {r.state for r in store.attempts()} == {"staging"}
        with pytest.raises(anyio.BrokenResourceError):  # the cancelled stage closed its input
            send.send_nowait(staged[-1])
    finally:
        store.close()


@pytest.mark.parametrize("codec", ["h264", "libsvtav1"])
def test_same_frames_encode_to_the_same_bytes_every_time(codec):
    """A resumed or re-run attempt must stage the same video bytes as the first run (content hashes are
    compared across runs): encoding one episode's frames again, in the same process, gives identical bytes.
    Without stages/malloc.py's fixed heap fill, libx264 gave several distinct streams out of 20 here."""
    import hashlib

    from demoforge.pipeline.job import VideoSettings
    from demoforge.stages.camera_encoder import CameraEncoder
    from demoforge.storage.schema import CameraSpec

    size = 32
    yy, xx = np.mgrid[0:size, 0:size]
    frames = [np.stack([(xx * 4 + t * 8) % 256, (yy * 4) % 256, np.full_like(xx, t * 3 % 256)], -1).astype(np.uint8)
              for t in range(30)]
    digests = set()
    for _ in range(20):
        encoder = CameraEncoder(CameraSpec("cam", size, size), 10, VideoSettings(codec=codec))
        data = b"".join(encoder.encode(f) for f in frames) + encoder.finish()
        digests.add(hashlib.blake2b(data).hexdigest())
    assert len(digests) == 1, f"{len(digests)} distinct {codec} streams from the same frames"
