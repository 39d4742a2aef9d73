"""MLflow logging (`train.loggers: [..., mlflow]`, torchboost.train.tracking): a real SQLite store in the run
folder, read back with MlflowClient. A training resumed after a kill continues the same MLflow run with one point
per epoch; an epoch whose metrics a kill lost is logged at the resume; only rank 0 talks to MLflow; without the
extra the recipe is refused in one line; nothing is written to the current folder or HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch.utils.data import TensorDataset

from torchboost.cli import main
from torchboost.data import build_loader
from torchboost.errors import ConfigError
from torchboost.recipe.callbacks import build_callbacks, mlflow_logger
from torchboost.recipe.load import load_config
from torchboost.train.callbacks import CheckpointConfig, ModelCheckpoint
from torchboost.train.state import Callback
from torchboost.train.tracking import INSTALL, MLflowLogger, local_store, param_text, safe_keys
from train_tiny import tiny_data, tiny_model

REPO = Path(__file__).resolve().parents[1]
FAST = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


def client_for(out: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(local_store(out)[0])


def only_run(client):
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def artifact_dir(run) -> Path:
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    return Path(url2pathname(urlparse(run.info.artifact_uri).path))


@pytest.mark.slow
def test_a_resumed_training_continues_its_mlflow_run_inside_the_run_folder(tmp_path, monkeypatch, one_thread):
    from torchboost.plotting import pyplot

    pyplot()  # matplotlib settles its caches under the real HOME first: only MLflow is watched below
    home, cwd, out = tmp_path / "home", tmp_path / "cwd", tmp_path / "run"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CONFIG_HOME", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(cwd)

    assert main(["train", "-c", "digits-lenet", "--epochs", "2", "-b", "128", "-o", str(out),
                 "--set", "train.loggers=[csv,mlflow]", *FAST]) == 0
    assert main(["train", "--force", "--resume", str(out), "--epochs", "3", *FAST]) == 0  # one more epoch

    client = client_for(out)
    run = only_run(client)
    assert run.info.status == "FINISHED" and client.get_experiment(run.info.experiment_id).name == "digits-lenet"
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    for key in {k for r in rows for k in r} - {"epoch"}:  # everything the history row has, once per epoch
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == [r["epoch"] for r in rows if key in r], key
        assert [m.value for m in history] == pytest.approx([r[key] for r in rows if key in r]), key
    assert {"val_top_1_accuracy", "val_top_5_accuracy", "val_loss", "train_loss", "lr", "train_time_s"} <= set(
        run.data.metrics)
    params = run.data.params
    assert (params["model.name"], params["optim.lr"], params["train.loggers"]) == ("mnist_cnn", "0.05",
                                                                                 '["csv", "mlflow"]')
    assert params["train.epochs"] == "2" and run.data.tags["resume.train.epochs"] == "3"  # MLflow keeps the first
    assert params["output"] == str(out)  # the folder the run wrote, not the recipe's template
    files = artifact_dir(run)
    assert files.is_relative_to(out)
    assert (files / "config.yaml").read_bytes() == (out / "config.yaml").read_bytes()
    assert (files / "checkpoints" / "mnist_cnn-best.pt").read_bytes() == (out / "ckpt" / "mnist_cnn-best.pt").read_bytes()
    assert sorted(os.listdir(cwd)) == [] and sorted(os.listdir(home)) == []  # no ./mlruns, ~/.mlflow, ~/.config


class Killed(Exception):
    pass


class KillAfterCheckpoint(Callback):
    """Stops the process (an exception) at an epoch's end, after its checkpoint, before MLflow logs it."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, state) -> None:
        if state.epoch + 1 == self.epoch:
            raise Killed


def tiny_run(out: Path, epochs: int, resume: Path | None = None, *extra: Callback, params=None) -> MLflowLogger:
    uri, location = local_store(out)
    logger = MLflowLogger(uri, "tiny", run_name="tiny", params=params or {"optim.lr": 0.1}, artifact_location=location,
                          confine=out)
    model = tiny_model(seed=0, compute_accuracy=True)
    if resume is not None:
        model.load_checkpoint(resume)
    train = build_loader(TensorDataset(*tiny_data(48, seed=1)), 8, True, seed=3)
    test = build_loader(TensorDataset(*tiny_data(20, seed=2)), 10, False)
    ckpt = ModelCheckpoint("tiny", out / "ckpt", CheckpointConfig(keep_checkpoint_max=10))
    model.train(epochs, train, [ckpt, *extra, logger], eval_data=test, log_fn=lambda _: None)
    return logger


@pytest.mark.slow
def test_an_epoch_lost_to_a_kill_is_logged_at_resume_and_a_rerun_epoch_adds_a_point(tmp_path, one_thread):
    out = tmp_path / "run"
    long = "x" * 7000
    with pytest.raises(Killed):  # epoch 2's checkpoint is written, its metrics never reach MLflow
        tiny_run(out, 3, None, KillAfterCheckpoint(2), params={"long": long, "optim.weight_decay_groups.fc.*": 0.0})
    client = client_for(out)
    run_id = only_run(client).info.run_id
    assert steps(client, run_id, "train_loss") == [1] and only_run(client).info.status == "RUNNING"

    tiny_run(out, 3, out / "ckpt" / "tiny-2_6.pt")  # the checkpoint carries the run id
    run = only_run(client)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    for key in ("train_loss", "val_top_1_accuracy", "global_step", "lr"):
        assert steps(client, run_id, key) == [1, 2, 3], key  # epoch 2 from the checkpoint's results
    assert [m.value for m in sorted(client.get_metric_history(run_id, "global_step"), key=lambda m: m.step)] == \
        [6, 12, 18]

    # MLflow keeps every point: epochs that run again (from an older checkpoint) are logged again at their step,
    # and the newest point of each step, the one MLflow reports, is the run that went on
    tiny_run(out, 3, out / "ckpt" / "tiny-1_6.pt")
    assert steps(client, run_id, "train_loss") == [1, 2, 2, 3, 3]
    latest = client.get_run(run_id).data.metrics
    assert latest["global_step"] == 18

    params = run.data.params  # cut at MLflow's limit with a marker; a pattern key made a valid name
    assert len(params["long"]) == 6000 and params["long"].endswith("...[truncated: 7000 chars]")
    assert params["optim.weight_decay_groups.fc._"] == "0.0"


def test_param_text_and_keys():
    assert param_text(None) == "null" and param_text([1, 2]) == "[1, 2]" and param_text("a b") == "a b"
    assert param_text("y" * 6000) == "y" * 6000
    names = safe_keys(["a.*", "a._", "b" * 300])
    assert names["a.*"] == "a._" and names["a._"] == "a.__2" and len(names["b" * 300]) == 250


def test_other_ranks_make_no_mlflow_call(tmp_path, monkeypatch, one_thread):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # any import of mlflow would fail
    logger = MLflowLogger("sqlite:///never.db", "tiny", rank=1)
    model = tiny_model(seed=0)
    model.train(1, build_loader(TensorDataset(*tiny_data(16, seed=1)), 8, True, seed=3), [logger],
                log_fn=lambda _: None)
    assert logger.state_dict() == {} and logger.run_id is None and not (tmp_path / "never.db").exists()

    import torchboost.distributed

    monkeypatch.setattr(torchboost.distributed, "get_rank", lambda: 1)  # the recipe asks the rank helper
    from torchboost.recipe.config import build_config

    cfg = build_config({"name": "digits-lenet"}, ["train.loggers=[mlflow]"])  # not validated: mlflow is blocked
    callbacks, _ = build_callbacks(cfg, tmp_path / "run", [], None, lambda _: None)
    (logger,) = [cb for cb in callbacks if isinstance(cb, MLflowLogger)]
    assert not logger.active and logger._mlflow is None and not (tmp_path / "run").exists()


def test_without_the_extra_asking_for_mlflow_is_one_config_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if mlflow-skinny were not installed
    assert main(["train", "-c", "digits-lenet", "--set", "train.loggers=[mlflow]", "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "mlflow is not installed" in err and INSTALL in err, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ImportError, match=r"torchboost\[tracking\]"):
        MLflowLogger("http://localhost:5000", "e")

    monkeypatch.delitem(sys.modules, "mlflow")
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # the default SQLite store needs SQLAlchemy too...
    with pytest.raises(ConfigError, match="sqlalchemy is not installed"):
        load_config("digits-lenet", ["train.loggers=[mlflow]"])
    load_config("digits-lenet", ["train.loggers=[mlflow]", "train.mlflow.tracking_uri=http://localhost:5000"])  # ...a server not
    with pytest.raises(ConfigError, match="train.mlflow.experiment is set but train.loggers"):
        load_config("digits-lenet", ["train.mlflow.experiment=x"])


def test_the_store_is_the_key_then_mlflow_tracking_uri_then_the_run_folder(tmp_path, monkeypatch):
    from torchboost.recipe.config import build_config

    ckpt = ModelCheckpoint("m", tmp_path / "ckpt")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = build_config({"name": "job"}, ["train.loggers=[mlflow]"])
    here = mlflow_logger(cfg, tmp_path / "run", ckpt)
    assert (here.tracking_uri, here.confine, here.experiment) == (local_store(tmp_path / "run")[0], tmp_path / "run", "job")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert mlflow_logger(cfg, tmp_path / "run", ckpt).tracking_uri == "http://tracking:5000"
    cfg = build_config({"name": "job"}, ["train.loggers=[mlflow]", "train.mlflow.tracking_uri=sqlite:///x.db",
                                         "train.mlflow.experiment=exp"])
    keyed = mlflow_logger(cfg, tmp_path / "run", ckpt)
    assert (keyed.tracking_uri, keyed.confine, keyed.experiment) == ("sqlite:///x.db", None, "exp")


CI_VARS = ("PYTEST_CURRENT_TEST", "GITHUB_ACTIONS", "CI", "CIRCLECI", "GITLAB_CI", "JENKINS_URL", "TRAVIS", "TF_BUILD",
           "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE", "TEAMCITY_VERSION", "CLOUD_RUN_EXECUTION",
           "DO_NOT_TRACK", "XDG_CONFIG_HOME")


@pytest.mark.slow
def test_a_default_run_imports_no_mlflow_and_the_logger_writes_nothing_in_home(tmp_path):
    """In a fresh interpreter outside pytest's and CI's variables (MLflow turns its telemetry off by itself there,
    which would make this pass for the wrong reason): building the default callbacks imports no mlflow; a logging
    run writes nothing in HOME (MLflow's telemetry id, ~/.config/mlflow) or in the current folder."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in CI_VARS and not k.startswith(("MLFLOW_", "RUNBOT_"))}
    env.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from torchboost.recipe.callbacks import build_callbacks
        from torchboost.recipe.config import build_config
        build_callbacks(build_config({{"name": "x"}}), Path({str(tmp_path / 'default')!r}), [], None, print)
        assert "mlflow" not in sys.modules, "the default loggers imported mlflow"
        from test_tracking import tiny_run
        tiny_run(Path({str(tmp_path / 'run')!r}), 1)
        from mlflow.telemetry import utils
        print("telemetry", os.environ.get("MLFLOW_DISABLE_TELEMETRY"), getattr(utils, "_IS_IN_CI_ENV_OR_TESTING", None))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(home)) == [] and sorted(os.listdir(cwd)) == []
    assert "telemetry true False" in proc.stdout  # off because the logger said so, not because of CI detection
    assert (tmp_path / "run" / "mlflow" / "mlflow.db").is_file()


@pytest.mark.parametrize("uri", ["sqlite:///{outside}/mlflow.db", "{outside}/mlruns", "http://user:pw@127.0.0.1:9/api",
                                 "file:///{outside}/" + "a" * 300 + "\nerror: forged"])
@pytest.mark.slow
def test_no_store_a_resumed_file_names_is_touched(tmp_path, monkeypatch, one_thread, capsys, uri):
    """The generator over store URIs saved in a checkpoint (local paths, files, loopback servers with and without
    credentials, a hosted scheme, long and control-character names): every resume logs to the run's own store
    and leaves the named place alone."""
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out, outside = tmp_path / "run", tmp_path / "outside"
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-b", "512", "-o", str(out),
                 "--set", "train.loggers=[csv,mlflow]", *FAST]) == 0
    (ckpt,) = (out / "ckpt").glob("mnist_cnn-1_*.pt")
    state = torch.load(ckpt, weights_only=True)
    state["config"]["train"]["mlflow"]["tracking_uri"] = uri.format(outside=outside)
    torch.save(state, ckpt)
    capsys.readouterr()
    assert main(["train", "--force", "--resume", str(out), "--epochs", "2", *FAST]) == 0
    said = capsys.readouterr().out
    assert not outside.exists() and sorted(os.listdir(tmp_path)) == ["outside", "run"][1:]
    assert "a file never chooses where data goes" in said and "\nerror: forged" not in said
    assert steps(client_for(out), only_run(client_for(out)).info.run_id, "val_top_1_accuracy") == [1, 2]


@pytest.mark.parametrize("scheme", ["sqlite", "file"])
def test_a_users_local_store_keeps_the_artifacts_in_the_run_folder_not_in_mlruns(tmp_path, monkeypatch, one_thread,
                                                                                scheme):
    """MLFLOW_TRACKING_URI naming a database or file store of the user's: the experiment torchboost creates keeps
    its artifacts in OUTPUT/mlflow/artifacts, where MLflow's default would be ./mlruns of the current folder; a
    second run in that experiment from another folder is told where its artifacts went; a server keeps its own."""
    from mlflow.tracking import MlflowClient

    from torchboost.recipe.config import build_config

    cwd, store = tmp_path / "cwd", tmp_path / "store"
    cwd.mkdir()
    store.mkdir()
    monkeypatch.chdir(cwd)
    uri = f"sqlite:///{store / 'mlflow.db'}" if scheme == "sqlite" else (store / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses its file store unless told
    cfg = build_config({"name": "job"}, ["train.loggers=[mlflow]"])
    said = []
    for out in (tmp_path / "run", tmp_path / "other"):
        ckpt = ModelCheckpoint("tiny", out / "ckpt")
        logger = mlflow_logger(cfg, out, ckpt)
        assert (logger.tracking_uri, logger.confine) == (uri, None)  # the user's store, never moved
        model = tiny_model(seed=0)
        out.mkdir()
        (out / "config.yaml").write_text("name: job\n")
        model.train(1, build_loader(TensorDataset(*tiny_data(16, seed=1)), 8, True, seed=3), [ckpt, logger],
                    log_fn=said.append)
    client = MlflowClient(uri)
    first, second = sorted(client.search_runs([client.get_experiment_by_name("job").experiment_id]),
                           key=lambda r: r.info.start_time)
    for run in (first, second):
        assert artifact_dir(run).is_relative_to(tmp_path / "run" / "mlflow" / "artifacts")  # the experiment's
        assert (artifact_dir(run) / "config.yaml").read_text() == "name: job\n"
        assert [p.name for p in (artifact_dir(run) / "checkpoints").iterdir()] == ["tiny-1_2.pt"]
    assert os.listdir(cwd) == []  # no ./mlruns
    started = [line for line in said if line.startswith("mlflow: run")]
    assert "artifacts go to" not in started[0] and f"artifacts go to {first.info.artifact_uri[:-len(first.info.run_id) - 11]}" \
        in started[1] and "train.mlflow.experiment" in started[1], started

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://tracking.example:5000")
    assert mlflow_logger(cfg, tmp_path / "run", ModelCheckpoint("m", tmp_path / "c")).artifact_location is None
