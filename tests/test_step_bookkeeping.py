"""The loop's bookkeeping between steps, at a cost a tenth-of-a-second step can afford: TensorBoard
gets one event per step that holds every scalar (readable by TensorBoard as separate series), Ray's
gauges get the latest value of each key at most once a second with nothing left unsent at the end, and
replica deaths are read from the GCS at most once a second unless asked fresh."""

import pytest

from orchestrator import metrics as M


def rows(n: int) -> list[dict]:
    return [{"step": s, "reward/mean": 0.1 * s, "time/step_s": 0.2, "eval/accuracy": 0.5 + s / 100 if s % 2 == 0 else None,
             "samples/lost": 0, "note": "text is not a scalar"} for s in range(1, n + 1)]


def test_tensorboard_reads_every_scalar_of_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = M.MetricsSink(tmp_path, ray_metrics=False)
    for row in rows(4):
        sink.log(row)
    sink.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["eval/accuracy", "reward/mean", "samples/lost", "time/step_s"]
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("reward/mean")] == [(s, round(0.1 * s, 6)) for s in range(1, 5)]
    assert [e.step for e in events.Scalars("eval/accuracy")] == [2, 4]  # None is not written


def test_a_resumed_run_drops_the_events_written_after_its_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = M.MetricsSink(tmp_path, ray_metrics=False)
    for row in rows(5):
        sink.log(row)
    sink.close()
    sink = M.MetricsSink(tmp_path, resume_step=3, ray_metrics=False)
    for row in rows(6)[3:]:
        sink.log({**row, "reward/mean": -row["step"]})
    sink.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("reward/mean")] == [
        (1, 0.1), (2, 0.2), (3, 0.3), (4, -4.0), (5, -5.0), (6, -6.0)]


class FakeGauge:
    sets: list = []

    def __init__(self, name, description=""):
        self.name = name

    def set(self, value):
        FakeGauge.sets.append((self.name, value))


@pytest.fixture
def gauges(monkeypatch):
    import ray.util.metrics

    FakeGauge.sets = []
    monkeypatch.setattr(ray.util.metrics, "Gauge", FakeGauge)
    clock = [100.0]
    monkeypatch.setattr(M.time, "monotonic", lambda: clock[0])
    return clock


def test_gauges_send_the_latest_values_at_most_once_a_second_and_the_rest_at_the_end(tmp_path, gauges):
    sink = M.MetricsSink(tmp_path, ray_metrics=False)
    sink._gauges = {}  # mirrored to (fake) Ray gauges, without a Ray cluster for the tagged metrics
    for row in rows(3):  # within one second: the first step's values go at once, the rest wait
        sink.log(row)
    assert sorted(FakeGauge.sets) == [("coevo_reward_mean", pytest.approx(0.1)), ("coevo_samples_lost", 0.0),
                                      ("coevo_time_step_s", 0.2)]
    gauges[0] += 1.5
    sink.log(rows(4)[3])  # a second later: the latest value of every key, held-out accuracy now among them
    sent = dict(FakeGauge.sets[3:])
    assert sent["coevo_reward_mean"] == pytest.approx(0.4) and sent["coevo_eval_accuracy"] == pytest.approx(0.54)
    FakeGauge.sets = []
    sink.log(rows(5)[4])
    assert FakeGauge.sets == []
    sink.finish("finished")  # the run's end sends what is left
    assert dict(FakeGauge.sets)["coevo_reward_mean"] == pytest.approx(0.5)
    sink.close()


def test_restart_counts_are_read_from_the_gcs_at_most_as_often_as_asked(monkeypatch):
    import ray
    import ray._private.state

    from orchestrator import roles

    queries = []
    monkeypatch.setattr(ray._private.state, "actors", lambda job_id=None: queries.append(job_id) or {"a1": {"NumRestarts": len(queries)}})
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"get_job_id": lambda self: "01000000"})())
    monkeypatch.setattr(roles, "_restarts_read", ("", float("-inf"), None))
    clock = [50.0]
    monkeypatch.setattr(roles.time, "monotonic", lambda: clock[0])
    assert roles._job_restarts(1.0) == {"a1": 1}
    clock[0] += 0.5
    assert roles._job_restarts(1.0) == {"a1": 1} and len(queries) == 1  # younger than a second: reused
    assert roles._job_restarts() == {"a1": 2}  # asked fresh (evaluated steps, tests, the last step)
    clock[0] += 1.0
    assert roles._job_restarts(1.0) == {"a1": 3}


def test_the_plot_starts_held_out_accuracy_at_the_warm_start(tmp_path):
    """The last line compares the end with the warm start: the plot shows that point too, at step 0."""
    sink = M.MetricsSink(tmp_path, ray_metrics=False)
    for row in rows(4):
        sink.log(row)
    assert sink.series(0.42)["eval/accuracy"] == [(0, 0.42), (2, 0.52), (4, 0.54)]
    assert sink.series()["eval/accuracy"] == [(2, 0.52), (4, 0.54)]  # no stage measured one
    assert sink.series(0.42)["reward/mean"][0] == (1, 0.1)
    (path,) = sink.plot(0.42)
    assert path.stat().st_size > 1000
    sink.close()
