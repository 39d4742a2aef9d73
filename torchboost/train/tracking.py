"""`MLflowLogger`: a run's parameters, per-epoch metrics and final artifacts in an MLflow tracking store (rank 0).

MLflow is imported only when a logger is built on rank 0 (`pip install 'torchboost[tracking]'`: mlflow-skinny,
plus SQLAlchemy and alembic for a database store such as the default SQLite file). Every call goes through an
`MlflowClient` bound to the URI given here: no process-wide active run, and MLflow's own environment variables
(MLFLOW_TRACKING_URI) are the caller's to honour (`tracking_uri_from_env`). Before the first import, MLflow's
usage telemetry is turned off unless the user decided (MLFLOW_DISABLE_TELEMETRY already set): it would write an
installation id under ~/.config and send events from a background thread.

Resume: the MLflow run id travels in the checkpoint (`state_dict`), so a resumed training continues the same
MLflow run. Metrics are logged once per epoch at step = the epoch (1-based, as history.jsonl counts them). An
epoch whose checkpoint was written but whose metrics a kill prevented is logged at the resume from the
checkpoint's results, when the run holds no point at that step. An epoch that runs again (a resume from a
checkpoint older than the last logged epoch) is logged again at the same step: MLflow keeps every point and
reports the newest as the run's value, the one of the run that went on. Parameters are the resolved config at
the start; a value a resume changes cannot be rewritten (MLflow refuses), so it becomes the tag `resume.KEY`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional
from urllib.parse import urlparse
from urllib.request import url2pathname

from torchboost.errors import OutputError, TorchboostError, printable
from torchboost.fileio import check_inside, check_regular, make_dirs, within
from torchboost.train.history import epoch_row
from torchboost.train.state import Callback, TrainState

INSTALL = "pip install 'torchboost[tracking]'"
SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # SQLAlchemy stores: they also need sqlalchemy, alembic
BATCH_PARAMS = 100  # MLflow's limits (mlflow.utils.validation), used when the installed one does not say
MAX_KEY, MAX_PARAM, MAX_TAG = 250, 6000, 8000
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BAD_KEY_CHARS = re.compile(r"[^\w.\- :]")  # MLflow's names: alphanumerics, _ - . space : (and /, left out here)

Artifacts = Callable[[], Iterable[tuple[Path, Optional[str]]]]


def required_modules(tracking_uri: str) -> tuple[str, ...]:
    """The top-level modules a store at `tracking_uri` needs: a database store also needs SQLAlchemy and alembic
    (mlflow-skinny leaves them out)."""
    scheme = urlparse(tracking_uri).scheme.split("+", 1)[0].lower()
    return ("mlflow", "sqlalchemy", "alembic") if scheme in SQL_SCHEMES else ("mlflow",)


def missing_modules(names: Iterable[str]) -> list[str]:
    """Those of `names` that cannot be imported (found without importing them; a module set to None in
    sys.modules, the way an import is blocked, counts as missing)."""
    missing = []
    for name in names:
        if name in sys.modules:
            if sys.modules[name] is None:
                missing.append(name)
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def tracking_uri_from_env() -> Optional[str]:
    """MLFLOW_TRACKING_URI when the user set it (empty counts as unset)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or None


SERVER_SCHEMES = ("http", "https", "databricks", "databricks-uc", "uc")  # the server decides where artifacts go


def artifacts_here(tracking_uri: str) -> bool:
    """Whether MLflow's client, not a tracking server, writes a run's artifacts for a store at `tracking_uri`:
    a database (SQLite, PostgreSQL...) or file store, whose experiments created without a location put them in
    ./mlruns of whatever folder the process runs in; a server (http, Databricks) stores them where it says."""
    return urlparse(tracking_uri).scheme.lower() not in SERVER_SCHEMES


def artifact_folder(folder: str | os.PathLike) -> str:
    """The artifact location (a file: URI) of experiments created for a run in `folder`: FOLDER/mlflow/artifacts."""
    return (Path(os.path.abspath(folder)) / "mlflow" / "artifacts").as_uri()


def local_store(folder: str | os.PathLike) -> tuple[str, str]:
    """(tracking URI, artifact location) of a store kept inside `folder`: FOLDER/mlflow/mlflow.db (SQLite, the
    store MLflow 3 recommends: its file store refuses to start unless told to) and FOLDER/mlflow/artifacts."""
    root = Path(os.path.abspath(folder)) / "mlflow"
    if "?" in str(root):  # a URI's query would start there: SQLAlchemy would open another file
        raise OutputError(f"the MLflow store {root} has a '?' in its path, which an SQLite URI cannot hold",
                          "choose another --output, or set train.mlflow.tracking_uri")
    if os.path.lexists(root / "mlflow.db"):  # a FIFO there held SQLite for minutes of retries and warnings
        check_regular(root / "mlflow.db", OutputError)
    return f"sqlite:///{root / 'mlflow.db'}", artifact_folder(folder)


def param_text(value: Any, limit: int = MAX_PARAM) -> str:
    """A parameter value as MLflow stores it: strings as they are, anything else as JSON (None -> null, lists
    as [..]: what `--set` reads back); longer than `limit`, cut with a marker that says how long it was."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= limit:
        return text
    marker = f"...[truncated: {len(text)} chars]"
    return text[: limit - len(marker)] + marker


def safe_keys(keys: Iterable[str]) -> dict[str, str]:
    """{key: the name MLflow accepts}: characters it refuses become '_' (free-form keys such as the patterns of
    optim.weight_decay_groups), at most 250 characters, and two keys never share a name."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for key in keys:
        name = _BAD_KEY_CHARS.sub("_", str(key))[:MAX_KEY] or "_"
        base, n = name, 2
        while name in taken or name in ("..", ".") or name.startswith(".."):
            suffix = f"_{n}"
            name, n = base[: MAX_KEY - len(suffix)] + suffix, n + 1
        taken.add(name)
        out[key] = name
    return out


def import_mlflow(tracking_uri: str) -> Any:
    """The mlflow module, with telemetry off unless the user chose (see the module's doc); ImportError naming
    the install command when it, or what a database store needs, is missing."""
    missing = missing_modules(required_modules(tracking_uri))
    if missing:
        raise ImportError(f"MLflow logging to {tracking_uri} needs {', '.join(missing)}: {INSTALL}")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow's HTTP defaults (7 retries with doubling back-off, 120 s per request) stall a run for minutes on
    # a closed port; a store that does not answer in seconds is reported then (the user's own values win)
    for key, value in HTTP_LIMITS.items():
        os.environ.setdefault(key, value)
    import mlflow  # noqa: PLC0415 - the optional dependency, only when asked for

    db_log = logging.getLogger("mlflow.store.db.utils")  # "Creating initial MLflow database tables...", per store
    if db_log.level == logging.NOTSET:
        db_log.setLevel(logging.WARNING)
    return mlflow


HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
MESSAGE_CHARS = 300


def _one_line(e: BaseException) -> str:
    """The store's error on one line; a long one keeps its start and its end, where requests and SQLAlchemy
    put the cause ("Connection refused", "unable to open database file")."""
    text = printable(" ".join(line.strip() for line in str(e).strip().splitlines()) or type(e).__name__)
    if len(text) <= MESSAGE_CHARS:
        return text
    return f"{text[:MESSAGE_CHARS // 2 - 3]} … {text[-(MESSAGE_CHARS // 2 - 2):]}"


class MLflowLogger(Callback):
    """Logs to MLflow at `tracking_uri` (rank 0 only; other ranks make no MLflow call and import nothing):

    - at the start, a run in `experiment` (created when missing, with `artifact_location` when given: an
      existing experiment keeps its own, which the start-up line names when it differs) named `run_name`, with `params` (flat {dotted key: value}; values as `param_text`) and `tags`; a resumed
      training reopens the run of its checkpoint instead;
    - after each epoch, every numeric result of the epoch (history.jsonl's row: train loss and accuracy, val
      top-1/top-5/loss, lr, time...) at step = the epoch;
    - at the end, the files `artifacts()` returns ((path, folder in the run's artifacts or None); missing files
      are left out), then the run is marked finished.

    `confine`: a folder the run's local artifacts must lie in (the run folder, for the store kept there): a run
    whose artifact folder is elsewhere (the run folder was moved since) gets no artifacts, with a warning,
    rather than a write outside it. Failures of the store become one OutputError naming the URI."""

    def __init__(self, tracking_uri: str, experiment: str, *, run_name: Optional[str] = None,
                 params: Optional[Mapping[str, Any]] = None, tags: Optional[Mapping[str, str]] = None,
                 artifacts: Optional[Artifacts] = None, artifact_location: Optional[str] = None,
                 confine: Optional[str | os.PathLike] = None, rank: int = 0) -> None:
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.params, self.tags = dict(params or {}), dict(tags or {})
        self.artifacts, self.artifact_location = artifacts, artifact_location
        self.confine = Path(confine) if confine is not None else None
        self.rank = rank
        self.run_id: Optional[str] = None  # set at the start, or by load_state_dict for a resumed training
        self._client: Any = None
        self._metric: Any = None
        self._limits: Any = None
        self._mlflow = import_mlflow(tracking_uri) if self.active else None

    @property
    def active(self) -> bool:
        return self.rank == 0

    # --- the store, every call turned into one line on failure ---------------------------------------------
    def _call(self, what: str, fn: Callable, *args, **kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except TorchboostError:
            raise
        except Exception as e:  # noqa: BLE001 - MLflow, SQLAlchemy, requests: whatever the store raised
            raise self._error(what, e) from e

    def _error(self, what: str, e: BaseException) -> OutputError:
        saved = self.artifacts is not None and any(
            path is not None and path.is_file() for path, folder in self.artifacts() if folder == "checkpoints")
        then = ("the checkpoints are intact: continue with --resume" if saved else
                "no checkpoint was written yet: run the same command again once the store answers")
        return OutputError(f"MLflow at {self.tracking_uri}: cannot {what}: {_one_line(e)}",
                           f"check the tracking store (train.mlflow.tracking_uri), or drop mlflow from "
                           f"train.loggers; {then}")

    def _open(self) -> None:
        mlflow = self._mlflow
        self._metric = mlflow.entities.Metric
        try:
            from mlflow.utils import validation  # its limits: batch size, value length
        except ImportError:  # pragma: no cover - moved in some version: the documented defaults
            validation = None
        self._limits = validation
        self._client = self._call("connect", mlflow.tracking.MlflowClient, tracking_uri=self.tracking_uri)

    def _limit(self, name: str, default: int) -> int:
        return int(getattr(self._limits, name, default))

    # --- hooks ---------------------------------------------------------------------------------------------
    def on_train_begin(self, state: TrainState) -> None:
        if not self.active:
            return
        if self.confine is not None and self.tracking_uri.startswith("sqlite:///"):
            db = Path(self.tracking_uri[len("sqlite:///"):])  # local_store's URI: the path as it is
            make_dirs(db.parent)
            check_inside(db)  # no store written through a link out of the run folder
        self._open()
        run = self._reopen(state) if self.run_id else None
        if run is None:
            self._start(state)
        else:
            self._update_params(run.data.params)
            done = state.epoch  # epochs completed before this run
            if done > 0 and state.eval_results and done not in self._logged_steps():
                self._log_epoch(state, done)  # killed after the epoch's checkpoint, before its metrics

    def on_train_epoch_end(self, state: TrainState) -> None:
        if self.active:
            self._log_epoch(state, state.epoch + 1)

    def on_train_end(self, state: TrainState) -> None:
        if not self.active or self.run_id is None:
            return
        files = [(Path(p), folder) for p, folder in (self.artifacts() if self.artifacts else []) if p is not None]
        files = [(p, folder) for p, folder in files if p.is_file()]
        final = {k: v for k, v in state.final_results.items() if isinstance(v, (int, float))}
        if final:  # the test split's results, at the last epoch's step
            names, now = safe_keys(final), int(time.time() * 1000)
            self._call("log the final results", self._client.log_batch, self.run_id,
                       metrics=[self._metric(names[k], float(v), now, state.epoch + 1) for k, v in final.items()])
        if files and self._artifacts_allowed(state):
            for path, folder in files:
                self._call(f"log artifact {path.name}", self._client.log_artifact, self.run_id, str(path), folder)
        self._call("finish the run", self._client.set_terminated, self.run_id, "FINISHED")

    def state_dict(self) -> dict:
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state: dict) -> None:
        run_id = state.get("run_id")
        if run_id is not None and not (isinstance(run_id, str) and _RUN_ID.fullmatch(run_id)):
            raise ValueError(f"not an MLflow run id: {printable(run_id)[:80]}")
        self.run_id = run_id

    # --- helpers ---------------------------------------------------------------------------------------------
    def _start(self, state: TrainState) -> None:
        client = self._client
        exp = self._call("read the experiment", client.get_experiment_by_name, self.experiment)
        if exp is None or exp.lifecycle_stage == "deleted":
            if exp is not None:  # a deleted experiment keeps its name until purged: MLflow refuses to reuse it
                self._call("restore the experiment", client.restore_experiment, exp.experiment_id)
                exp_id = exp.experiment_id
            else:
                exp_id = self._call("create the experiment", client.create_experiment, self.experiment,
                                    artifact_location=self.artifact_location)
        else:
            exp_id = exp.experiment_id
        run = self._call("start a run", client.create_run, exp_id, run_name=self.run_name,
                         tags={k: param_text(v, self._limit("MAX_TAG_VAL_LENGTH", MAX_TAG)) for k, v in self.tags.items()})
        self.run_id = run.info.run_id
        self._log_params(self.params)
        state.log(f"mlflow: run {self.run_id} in experiment '{self.experiment}' at {self.tracking_uri}"
                  + self._artifacts_said(run.info.artifact_uri))

    def _artifacts_said(self, artifact_uri: str) -> str:
        """Where the run's artifacts go, when that is a local folder other than the one asked for: an experiment
        keeps the location it was created with (an earlier run's folder, or the user's choice)."""
        wanted = self.artifact_location
        if wanted is None or not artifact_uri or artifact_uri.startswith(wanted.rstrip("/") + "/"):
            return ""
        return (f"; its artifacts go to {artifact_uri}, the experiment's location since it was created (a new "
                "train.mlflow.experiment keeps them in this run folder)")

    def _reopen(self, state: TrainState) -> Any:
        """The checkpoint's run, marked running again; None (a new run follows) when the store does not hold it."""
        try:
            run = self._client.get_run(self.run_id)
        except Exception as e:  # noqa: BLE001
            if getattr(e, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise self._error("read the run", e) from e
            run = None
        if run is None or run.info.lifecycle_stage == "deleted":
            state.log(f"warning: the checkpoint's MLflow run {self.run_id} is not in {self.tracking_uri} (deleted, or "
                      "another store): the resumed training logs to a new run")
            self.run_id = None
            return None
        self._call("reopen the run", self._client.update_run, self.run_id, status="RUNNING")
        state.log(f"mlflow: continuing run {self.run_id} at {self.tracking_uri}")
        return run

    def _log_params(self, params: Mapping[str, Any]) -> None:
        limit = self._limit("MAX_PARAM_VAL_LENGTH", MAX_PARAM)
        names = safe_keys(params)
        entities = [self._mlflow.entities.Param(names[k], param_text(v, limit)) for k, v in params.items()]
        batch = self._limit("MAX_PARAMS_TAGS_PER_BATCH", BATCH_PARAMS)
        for i in range(0, len(entities), batch):
            self._call("log parameters", self._client.log_batch, self.run_id, params=entities[i:i + batch])

    def _update_params(self, logged: Mapping[str, str]) -> None:
        """A resumed run: parameters it lacks are logged; changed values (MLflow keeps the first) become tags."""
        limit = self._limit("MAX_PARAM_VAL_LENGTH", MAX_PARAM)
        names = safe_keys(self.params)
        new = {k: v for k, v in self.params.items() if names[k] not in logged}
        self._log_params(new)
        for key, value in self.params.items():
            text = param_text(value, limit)
            if names[key] in logged and logged[names[key]] != text:
                self._call("tag a changed parameter", self._client.set_tag, self.run_id,
                           f"resume.{names[key]}"[:MAX_KEY], text)

    def _logged_steps(self) -> set[int]:
        history = self._call("read the metrics", self._client.get_metric_history, self.run_id, "global_step")
        return {m.step for m in history}

    def _log_epoch(self, state: TrainState, epoch: int) -> None:
        row = {k: v for k, v in epoch_row(state, epoch).items() if k != "epoch"}  # the epoch is the step
        names = safe_keys(row)
        now = int(time.time() * 1000)
        metrics = [self._metric(names[k], float(v), now, epoch) for k, v in row.items()]
        self._call(f"log epoch {epoch}'s metrics", self._client.log_batch, self.run_id, metrics=metrics)

    def _artifacts_allowed(self, state: TrainState) -> bool:
        if self.confine is None:
            return True
        run = self._call("read the run", self._client.get_run, self.run_id)
        uri = run.info.artifact_uri
        parsed = urlparse(uri)
        if parsed.scheme not in ("", "file"):
            return True  # a remote artifact store: nothing is written here
        local = Path(url2pathname(parsed.path) if parsed.scheme else uri)
        if within(Path(os.path.realpath(local)), Path(os.path.realpath(self.confine))):
            return True
        state.log(f"warning: the MLflow run's artifact folder {local} is outside {self.confine} (the run folder "
                  "moved since the run began): the checkpoint and config.yaml are not logged to MLflow")
        return False
