"""The environment is input (docs/THREAT_MODEL.md, "Environment and peer processes"): RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT and TORCHELASTIC_RESTART_COUNT are parsed and
range-checked before anything connects (Hypothesis draws the strings); ranks form a job within a short join
timeout, each saying the same one line when one of them is missing or holds another job (a `--resume` given
to one rank only); a failed `launch` tells a config error from a crash and names the real worklog. Through
the real CLI: exit 2, one `error:` line, no traceback, no C++ frames, within a subprocess timeout."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from bounded import within
from hypothesis import strategies as st
from ranks import finish, job_env

from torchboost.cli import main
from torchboost.distributed import Described, check_timeout, read_env, restart_count
from torchboost.distributed.agent import child_failure
from torchboost.distributed.env import MAX_INT, TorchrunEnv
from torchboost.distributed.join import disagreement, join, open_store
from torchboost.distributed.launch import free_port
from torchboost.errors import DistributedError

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["train", "-c", "digits-lenet", "--set", "train.progress_bar=false", "--set", "train.log_every=1000"]
JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE")
# a valid environment: rank 1 of 4, the second process of two on the first machine
BASE = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0"}
# what each variable may hold given BASE's others: (low, high), or None for MASTER_ADDR (a host name)
RANGES = {"RANK": (0, 3), "WORLD_SIZE": (2, MAX_INT), "LOCAL_RANK": (0, 1), "LOCAL_WORLD_SIZE": (2, 4),
          "GROUP_RANK": (0, 3), "MASTER_PORT": (1, 65535), "TORCHELASTIC_RESTART_COUNT": (0, MAX_INT),
          "MASTER_ADDR": None}
TEXTS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str), st.integers(min_value=0, max_value=70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=12),
    st.sampled_from(["", " ", "\t", " 1 ", "1\n", "-0", "+1", "1_0", "1e3", "0x10", "007", "٣", "²", "１", "nan",
                     "65535", "65536", str(2**31 - 1), str(2**31), str(2**70), "0" * 5000 + "1", "a b", "host\x00",
                     "::1", "node-1.example", "ü.example", "x" * 254, "%(x)s"]))


@pytest.fixture(autouse=True)
def no_job_environment(monkeypatch):
    """These tests set the job's variables themselves; the machine's own must not leak in."""
    for name in JOB_VARS:
        monkeypatch.delenv(name, raising=False)


def expected(name: str, text: str):
    """The value a correct parser accepts, or None where it must refuse (written apart from the parser)."""
    if RANGES[name] is None:
        ok = 0 < len(text) <= 253 and all(33 <= ord(c) <= 126 for c in text)
        return text if ok else None
    low, high = RANGES[name]
    s = text.strip()
    if not (s.isascii() and s.isdigit()) or len(s.lstrip("0")) > 12:
        return None
    value = int(s.lstrip("0") or "0")  # int() itself refuses more than 4300 digits
    return value if low <= value <= high else None


def assert_one_line(e: DistributedError, name: str) -> None:
    """One line naming the variable (itself, or as the bound of the one it makes invalid)."""
    text = str(e)
    assert "\n" not in text and "\r" not in text and " — " in text, text
    assert name in e.what, text


@pytest.mark.parametrize("name", sorted(RANGES))
@given(text=TEXTS)
def test_every_variable_is_a_checked_value_or_one_line(name, text):
    env = {**BASE, name: text}
    want = expected(name, text)
    try:
        with within(60, f"read_env with {name}={text!r}"):  # a bound against a hang (a regex), not a speed claim
            got = read_env(env)
    except DistributedError as e:  # any other exception fails the test
        assert want is None, f"{name}={text!r} refused: {e}"
        return assert_one_line(e, name)
    field = {"RANK": "rank", "WORLD_SIZE": "world_size", "LOCAL_RANK": "local_rank", "GROUP_RANK": "group_rank",
             "LOCAL_WORLD_SIZE": "local_world_size", "MASTER_ADDR": "master_addr", "MASTER_PORT": "master_port",
             "TORCHELASTIC_RESTART_COUNT": "restart_count"}[name]
    assert want is not None and getattr(got, field) == want, f"{name}={text!r} accepted as {got}"
    assert 0 <= got.rank < got.world_size and 0 <= got.local_rank < got.local_world_size <= got.world_size


@given(text=TEXTS)
def test_restart_count_is_a_count_or_one_line(text):
    want = expected("TORCHELASTIC_RESTART_COUNT", text)
    try:
        with within(60, f"restart_count of {text!r}"):
            assert restart_count({"TORCHELASTIC_RESTART_COUNT": text}) == want
    except DistributedError as e:
        assert want is None
        assert_one_line(e, "TORCHELASTIC_RESTART_COUNT")


@given(seconds=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70),
                         st.sampled_from([1e300, 1e-300, 0.0, 1e-3, 604800, 604801, True])))
def test_timeouts_are_representable_or_one_line(seconds):
    try:
        check_timeout("timeout_s", seconds)
    except DistributedError as e:
        assert_one_line(e, "timeout_s")
        return
    assert datetime.timedelta(seconds=seconds).total_seconds() >= 1e-3  # c10d can hold it (0 would mean forever)


@pytest.mark.parametrize("env, message", [
    ({"RANK": "0"}, "environment variable RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "environment variable WORLD_SIZE is set but RANK is not"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "environment variable MASTER_PORT is not set"),
    ({**BASE, "LOCAL_WORLD_SIZE": "5"},
     "environment variable LOCAL_WORLD_SIZE='5' is not a whole number from 1 to 4 (WORLD_SIZE=4)"),
])
def test_half_an_environment_is_one_line_not_a_lone_run(env, message):
    with pytest.raises(DistributedError) as e:
        read_env(env)
    assert e.value.what == message
    assert read_env({}) is None  # neither RANK nor WORLD_SIZE: one process, as documented
    assert read_env({**BASE, "TORCHELASTIC_USE_AGENT_STORE": "True"}) == TorchrunEnv(
        1, 4, 1, 2, 0, "127.0.0.1", 29500, 0, agent_store=True)


@pytest.mark.parametrize("key, value", [("dist.timeout_s", "1e300"), ("dist.timeout_s", "0.0001"),
                                        ("dist.join_timeout_s", "1e300"), ("dist.join_timeout_s", "0")])
def test_timeouts_out_of_range_are_refused_by_validation(key, value, capsys):
    assert main([*TRAIN, "--print-config", "--set", f"{key}={value}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {key} must be >= 1 and <= 604800, got "), line


def test_a_bad_restart_count_is_one_line_before_the_config(monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "-1")
    assert main([*TRAIN, "--print-config"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: environment variable TORCHELASTIC_RESTART_COUNT='-1' is not a whole number from 0 to 2147483647 — "
        "torchrun sets it when it restarts a job; unset it when starting processes by hand"]


# -- the join: ranks in threads of this process, on a real TCPStore --

def _join_all(jobs: list[dict], timeout_s: float = 5, ranks: list[int] | None = None) -> list[str]:
    """Each rank in `ranks` (default all; a rank may come twice) joins with its job; returns what each said, in
    the order of `ranks` ('' = joined)."""
    port, world = free_port(), len(jobs)
    ranks = list(range(world)) if ranks is None else ranks
    said, stores = [""] * len(ranks), []

    def rank(i: int, r: int) -> None:
        env = TorchrunEnv(r, world, master_port=port)
        try:
            stores.append(open_store(env, timeout_s))  # kept: rank 0's hosts the job (a process group would)
            join(stores[-1], env, jobs[r], timeout_s)
        except DistributedError as e:
            said[i] = str(e)

    threads = [threading.Thread(target=rank, args=(i, r)) for i, r in enumerate(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank hung in join"
    return said


def test_ranks_holding_the_same_job_join_and_those_that_differ_say_the_same_line():
    job = {"resume": Described(None, "starts fresh"), "data.batch_size": 32}
    assert _join_all([job, job, job]) == ["", "", ""]
    same = [{"resume": Described("sha-of-x", f"resumes from {where}x.pt"), "a": 1} for where in ("", "/abs/", "./")]
    assert _join_all(same) == ["", "", ""]  # one checkpoint by three paths: the same job
    resumed = {**job, "resume": Described("sha-of-x", "resumes from runs/a/ckpt/x.pt")}
    said = _join_all([job, resumed, {**job, "data.batch_size": 64}])
    assert said[0] == said[1] == said[2]
    assert said[0] == ("ranks disagree on resume, data.batch_size (ranks [1, 2] differ from rank 0): each of ranks "
                       "0, 2 starts fresh, rank 1 resumes from runs/a/ckpt/x.pt — start every rank with the same "
                       "command line, config and files")


def test_a_rank_that_never_joins_is_named_by_every_rank_that_did():
    said = _join_all([{}, {}, {}], timeout_s=1, ranks=[0, 2])
    assert said == ["1 of the job's 3 processes did not join within 1 s (rank 1) — a rank that failed before joining "
                    "printed its own error: fix that one; otherwise start every rank (WORLD_SIZE counts them) or "
                    "raise dist.join_timeout_s"] * 2


def test_a_second_process_with_the_same_rank_is_refused_and_the_job_forms_without_it():
    said = _join_all([{}, {}], ranks=[0, 1, 1])
    assert sorted(said) == ["", "", "another process already joined this job as rank 1 — give every process its own "
                                    "RANK (torchrun does)"]


def test_disagreement_names_groups_of_ranks_without_listing_a_thousand():
    digests = ["a"] * 600 + ["b"] * 400
    payloads = {0: [["k", "1", "has k=1"]], 600: [["k", "2", "has k=2"]]}
    assert disagreement(digests, payloads) == (
        "ranks disagree on k (ranks [600, 601, 602, 603, 604, 605, 606, 607 and 392 more] differ from rank 0): each of "
        "ranks 0, 1, 2, 3 and 596 more has k=1, each of ranks 600, 601, 602, 603 and 396 more has k=2")
    assert disagreement(["a", "a"], {0: []}) is None


def test_a_failed_launch_tells_a_config_error_from_a_crash_and_names_the_real_worklog(tmp_path):
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "worklog.1").write_text("rank 1's log\n")
    refused = {0: SimpleNamespace(exitcode=2, timestamp=5), 1: SimpleNamespace(exitcode=2, timestamp=3)}
    what, fix = child_failure(refused, 0, tmp_path / "log")
    assert what == "training process rank 1 exited with code 2 after 0 restart(s)"
    assert f"kept in {tmp_path}/log/worklog.1" in fix and "fix the config" in fix
    assert "run the same command again" not in fix and "OUTPUT" not in fix
    crashed = {0: SimpleNamespace(exitcode=-9, timestamp=1), 1: SimpleNamespace(exitcode=2, timestamp=3)}
    what, fix = child_failure(crashed, 3, tmp_path / "log")
    assert what == "training process rank 0 was killed by SIGKILL after 3 restart(s)"
    assert fix == "its own error is printed above; run the same command again to continue from the newest checkpoint"


# -- the real CLI in subprocesses --

def cli(argv: list[str], timeout: float = 60, **env: str) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    environ.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **env)
    return subprocess.Popen([sys.executable, "-m", "torchboost", *argv], env=job_env(environ), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def one_error_line(proc: subprocess.Popen, timeout: float = 60) -> str:
    """The single `error:` line a refused run prints (exit 2, no traceback, no C++ frames or c10d log lines)."""
    ((out, err),) = finish([proc], timeout)  # the bound against a hang
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    for mark in ("Traceback", "frame #", "Exception raised from", "[c10d]", "c10::"):
        assert mark not in err, err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    return lines[0]


@pytest.mark.parametrize("env, message", [
    ({"RANK": "abc", "WORLD_SIZE": "2"},
     "error: environment variable RANK='abc' is not a whole number from 0 to 1 (WORLD_SIZE=2) — "),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "abc"},
     "error: environment variable MASTER_PORT='abc' is not a whole number from 1 to 65535 — "),
    ({"RANK": "5", "WORLD_SIZE": "2", "MASTER_PORT": "29500"},
     "error: environment variable RANK='5' is not a whole number from 0 to 1 (WORLD_SIZE=2) — each process needs "
     "its own RANK"),
    ({"TORCHELASTIC_RESTART_COUNT": "abc"}, "error: environment variable TORCHELASTIC_RESTART_COUNT='abc' is not "),
], ids=["rank-abc", "port-abc", "rank-5-of-2", "restart-count-abc"])
@pytest.mark.slow
def test_a_bad_environment_is_one_line_from_the_cli(env, message, tmp_path):
    assert one_error_line(cli([*TRAIN, "-o", str(tmp_path / "run")], **env)).startswith(message)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_lone_rank_says_in_one_line_that_its_peer_never_came(tmp_path):
    """Rank 1 without rank 0 (nobody hosts the store), and rank 0 without rank 1, each within the join timeout:
    the C++ connect errors c10d logs with stack traces do not reach the user."""
    short = ["--set", "dist.join_timeout_s=2", "-o", str(tmp_path / "run")]
    job = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    ports = free_port(), free_port()
    alone1 = cli([*TRAIN, *short], RANK="1", MASTER_PORT=str(ports[0]), **job)
    alone0 = cli([*TRAIN, *short], RANK="0", MASTER_PORT=str(ports[1]), **job)
    assert one_error_line(alone1) == (f"error: rank 1 could not reach the job's store at 127.0.0.1:{ports[0]} "
                                      "within 2 s (Connection refused) — start rank 0 (it hosts the store), check "
                                      "MASTER_ADDR and MASTER_PORT, or raise dist.join_timeout_s")
    assert one_error_line(alone0).startswith("error: 1 of the job's 2 processes did not join within 2 s (rank 1) — ")


@pytest.mark.slow
def test_resume_given_to_one_rank_only_stops_both_with_the_same_line(tmp_path):
    out = tmp_path / "run"
    assert main([*TRAIN, "--epochs", "1", "-o", str(out)]) == 0  # the checkpoint rank 1 resumes from
    (ckpt,) = (out / "ckpt").glob("mnist_cnn-1_*.pt")
    before = sorted(p.name for p in out.rglob("*"))
    job = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ranks = [cli([*TRAIN, "--epochs", "2", "-o", str(out)], RANK="0", LOCAL_RANK="0", **job),
             cli([*TRAIN, "--epochs", "2", "--force", "--resume", str(out)], RANK="1", LOCAL_RANK="1", **job)]
    said = [one_error_line(p, timeout=90) for p in ranks]
    assert said[0] == said[1], said
    assert said[0].startswith("error: ranks disagree on resume, ")
    assert f": rank 0 starts fresh, rank 1 resumes from {ckpt} — start every rank with the same command" in said[0]
    assert sorted(p.name for p in out.rglob("*")) == before  # nothing written by either rank
