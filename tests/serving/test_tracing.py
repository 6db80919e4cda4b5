"""The trace settings, sampling and files (``serving.tracing``), without a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving import tracing
from serving.errors import InvalidArgument
from serving.tracing import NAMES, NS, Tracer, TraceSettings, parse_changes, parse_setting
from tests.reliability.harness import says_what_to_fix


def on(path: Path, **more: Any) -> TraceSettings:
    settings: dict[str, Any] = {"trace_level": "TIMESTAMPS", "trace_rate": 1, **more}
    return TraceSettings(trace_file=str(path), **settings)


def run(tracer: Tracer, model: str, requests: int) -> list[int]:
    """``requests`` requests of ``model``, each traced one stamped and ended: their numbers."""
    traced = []
    for number in range(1, requests + 1):
        trace = tracer.start(model, 1)
        if trace is not None:
            second = number * 10  # stamps within it, a quarter of a second apart
            trace.stamp("REQUEST_START", second * NS)
            trace.span(second + 0.25, second + 0.5, second + 0.75)
            trace.stamp("REQUEST_END", (second + 1) * NS)
            tracer.end(trace)
            traced.append(number)
    return traced


def traces_in(path: Path) -> dict[int, dict[str, Any]]:
    """The traces of a file, by id: the header's fields and ``stamps`` (name -> ns)."""
    traces: dict[int, dict[str, Any]] = {}
    for record in json.loads(path.read_text()):
        trace = traces.setdefault(record["id"], {"stamps": {}})
        for stamp in record.pop("timestamps", []):
            trace["stamps"][stamp["name"]] = stamp["ns"]
        trace.update({k: v for k, v in record.items() if k != "id"})
    return traces


def test_one_request_in_rate_is_traced_until_the_count_is_spent(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(on(path, trace_rate=3, trace_count=2))
    assert tracer.enabled
    assert run(tracer, "vit", 20) == [3, 6]
    assert not tracer.enabled  # count spent: tracing costs nothing any more
    assert tracer.settings()["trace_count"] == ["0"]
    traces = traces_in(path)  # written when the count ran out, without a flush
    assert sorted(traces) == [1, 2]
    first = traces[1]
    assert (first["model_name"], first["model_version"]) == ("vit", 1)
    names = sorted(first["stamps"], key=first["stamps"].get)
    assert names == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]
    assert first["stamps"]["QUEUE_START"] == 30 * NS + NS // 4
    tracer.update("", {"trace_count": 1})  # setting the count again starts it again
    assert tracer.enabled and run(tracer, "vit", 3) == [3]


def test_log_frequency_writes_numbered_files(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(on(path, log_frequency=2))
    assert run(tracer, "vit", 5) == [1, 2, 3, 4, 5]
    assert [len(traces_in(Path(f"{path}.{n}"))) for n in (0, 1)] == [2, 2]
    assert not Path(f"{path}.2").exists() and not path.exists()
    tracer.flush()  # the server stops: the fifth goes out alone
    assert list(traces_in(Path(f"{path}.2"))) == [5]
    tracer.flush()  # nothing new: nothing written
    assert not Path(f"{path}.3").exists()


def test_without_log_frequency_the_file_holds_every_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(on(path))
    run(tracer, "vit", 2)
    assert not path.exists()
    tracer.flush()
    run(tracer, "vit", 1)
    tracer.flush()
    assert sorted(traces_in(path)) == [1, 2, 3]


def test_without_log_frequency_traces_are_appended_as_they_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "APPEND_EVERY", 2)
    path = tmp_path / "trace.json"
    tracer = Tracer(on(path))
    run(tracer, "vit", 5)  # appended at the 2nd and the 4th: at most 2 traces held
    assert sorted(traces_in(path)) == [1, 2, 3, 4]
    tracer.flush()
    assert sorted(traces_in(path)) == [1, 2, 3, 4, 5]
    path.unlink()  # removed under the server: the next write starts it again
    run(tracer, "vit", 2)
    assert sorted(traces_in(path)) == [6, 7]
    assert not list(tmp_path.glob("*.partial"))


def test_a_model_of_its_own_and_back(tmp_path: Path) -> None:
    path, own = tmp_path / "trace.json", tmp_path / "vit.json"
    tracer = Tracer(TraceSettings(trace_file=str(path)))
    assert not tracer.enabled and tracer.start("vit", 1) is None
    tracer.update("vit", {"trace_level": "TIMESTAMPS", "trace_rate": 2, "trace_file": str(own)})
    assert tracer.enabled
    assert tracer.settings("vit")["trace_level"] == ["TIMESTAMPS"]
    assert tracer.settings("translator")["trace_level"] == ["OFF"]  # follows the server's
    assert tracer.settings()["trace_level"] == ["OFF"]
    assert run(tracer, "translator", 4) == [] and run(tracer, "vit", 4) == [2, 4]
    tracer.update("vit", {"trace_level": None, "trace_file": None})  # cleared: the server's
    assert tracer.settings("vit")["trace_level"] == ["OFF"]
    assert tracer.settings("vit")["trace_rate"] == ["2"]  # still its own
    assert not tracer.enabled
    assert len(traces_in(own)) == 2  # a change writes what was collected
    tracer.update("", {"trace_level": "TIMESTAMPS", "trace_rate": 1})
    assert run(tracer, "vit", 2) == [2] and run(tracer, "captioner", 1) == [1]
    tracer.update("", {"trace_level": None})  # back to the start-up value, OFF
    assert not tracer.enabled
    assert {t["model_name"] for t in traces_in(path).values()} == {"vit", "captioner"}


@pytest.mark.parametrize(
    ("model", "changes", "message"),
    [
        ("", {"trace_level": "TIMESTAMPS"}, "needs a trace_file"),
        ("vit", {"trace_level": "TIMESTAMPS"}, "model 'vit'"),
        ("", {"trace_file": "/no/such/folder/t.json", "trace_level": "TIMESTAMPS"}, "not exist"),
    ],
)
def test_changes_that_cannot_trace_change_nothing(
    model: str, changes: dict[str, Any], message: str
) -> None:
    tracer = Tracer()
    before = tracer.settings(model)
    with pytest.raises(InvalidArgument, match=message) as err:
        tracer.update(model, changes)
    assert says_what_to_fix(str(err.value)), err.value
    assert tracer.settings(model) == before and not tracer.enabled


def test_a_file_that_cannot_be_written_fails_no_request(tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    tracer = Tracer(on(folder / "trace.json", log_frequency=1))
    folder.rmdir()
    assert run(tracer, "vit", 2) == [1, 2]  # logged and dropped


def test_parse_setting_examples() -> None:
    assert parse_setting("trace_level", ["timestamps"]) == "TIMESTAMPS"
    assert parse_setting("trace_count", ["-1"]) == -1
    assert parse_changes({"trace_rate": ["5"], "trace_file": []}) == {
        "trace_rate": 5,
        "trace_file": None,
    }
    for name, values, message in [
        ("trace_level", ["TENSORS"], "not supported"),
        ("trace_level", ["OFF", "TIMESTAMPS"], "one of"),
        ("trace_rate", ["0"], ">= 1"),
        ("trace_count", ["-2"], ">= -1"),
        ("log_frequency", ["x"], "integer"),
        ("trace_file", ["a", "b"], "one value"),
        ("trace_mode", ["triton"], "unknown trace setting"),
    ]:
        with pytest.raises(InvalidArgument, match=message) as err:
            parse_setting(name, values)
        assert says_what_to_fix(str(err.value)), err.value


@given(
    st.dictionaries(
        st.one_of(st.sampled_from(NAMES), st.text(max_size=12)),
        st.lists(st.one_of(st.text(max_size=8), st.integers(-5, 5).map(str)), max_size=3),
        max_size=6,
    )
)
def test_parse_changes_takes_or_refuses_anything(settings: dict[str, list[str]]) -> None:
    try:
        changes = parse_changes(settings)
    except InvalidArgument as err:
        assert str(err)
        return
    assert set(changes) == set(settings) <= set(NAMES)
    for name, value in changes.items():
        if value is None:
            assert not settings[name]
        elif name == "trace_file":
            assert value == settings[name][0]
        elif name == "trace_level":
            assert value in ("OFF", "TIMESTAMPS")
        else:
            assert isinstance(value, int) and str(value) == str(int(settings[name][0]))
