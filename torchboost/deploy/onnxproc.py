"""ONNX Runtime in a child process: a graph that runs too long is killed, Ctrl-C ends it at once, and what it
allocates or breaks stays in its own process.

A model reaches this module checked (`onnxcheck`: allowed ops only, no control flow, no external data), but an
allowed op can still be asked for too much (a Pad or a broadcast that makes gigabytes from a few numbers, a
Conv of a huge input), and a runtime bug stays a bug. ONNX Runtime's own `RunOptions.terminate` is read between
nodes only, so one long node outlives it, and a thread cannot be stopped at all. So the session lives in a
child process:

- started as `python -I` with the parent's `sys.path` less the '' entry (no PYTHON* variables, no user site,
  and the working folder Python would search first is not: a `numpy.py` beside the images is not imported);
  it imports numpy, onnxruntime and this module, never torch;
- its address space is capped (`memory_cap`: the machine's memory, at least 8 GiB), so an allocation past it
  fails inside the child as an ordinary error;
- loading has `LOAD_SECONDS`, each batch `RUN_SECONDS`; past that the child is killed and the parent says so;
- a KeyboardInterrupt (or any exception) in the parent kills it before it propagates, the terminal's Ctrl-C
  reaches it directly (it keeps SIGINT's default action: it ends even inside a node), a parent that goes away
  ends it (a watcher thread; ONNX Runtime releases the GIL while it runs), and the object's finalizer kills it;
- it runs in a private folder (working folder, HOME, TMPDIR and the XDG folders: ONNX Runtime writes a device id
  and a database under ~/.cache and a file in $TMPDIR), removed when it ends;
- its answers are a JSON header and raw float32 bytes (never pickle: the child runs untrusted computation),
  each checked by the parent before it is used, and nothing else it prints reaches the terminal.

Frames: an 8-byte big-endian length, then that many bytes; each message is a header frame (JSON) and a
payload frame.
"""

from __future__ import annotations

import json
import math
import os
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, BinaryIO, Optional

import numpy as np

LOAD_SECONDS = 300.0  # starting the child and building the session (a 2 GiB model takes seconds)
RUN_SECONDS = 600.0  # one batch (ResNet-152, 64 images of 224×224, one slow thread: about a minute)
MIN_MEMORY = 8 << 30  # the address-space cap never goes below this (ONNX Runtime's threads reserve much)
MAX_HEADER = 1 << 16  # bytes of one JSON header
_LENGTH = struct.Struct(">Q")
PRIVATE = ("HOME", "TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
         "from torchboost.deploy.onnxproc import serve; serve()")


class ChildFailed(Exception):
    """ONNX Runtime's process gave no usable answer; the message says why (its error, a deadline, its end)."""


class WrongOutput(ChildFailed):
    """The model ran but its output is not float32 logits of the shape asked for."""


def memory_cap() -> int:
    """Bytes of address space the child may use: the machine's memory, at least MIN_MEMORY."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # a platform without these names
        physical = 0
    return max(physical, MIN_MEMORY)


class OrtProcess:
    """An ONNX Runtime session of the checked model bytes `model` in a child process; `run(batch, shape)` gives
    its output. Every failure is a ChildFailed, after which the child is gone."""

    def __init__(self, model: bytes, input_name: str, threads: int = 0, *, load_seconds: Optional[float] = None,
                 run_seconds: Optional[float] = None, memory: Optional[int] = None) -> None:
        """None: LOAD_SECONDS, RUN_SECONDS, `memory_cap()`, read when called."""
        load_seconds = LOAD_SECONDS if load_seconds is None else load_seconds
        self.run_seconds = RUN_SECONDS if run_seconds is None else run_seconds
        paths = [p for p in sys.path if p]  # '' is the working folder: never searched
        home = ""
        try:
            home = tempfile.mkdtemp(prefix="torchboost-onnxruntime-")
            self.proc = subprocess.Popen([sys.executable, "-I", "-c", _BOOT, json.dumps(paths), str(os.getpid())],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         cwd=home, env={**os.environ, **{key: home for key in PRIVATE}})
        except OSError as e:
            if home:
                shutil.rmtree(home, ignore_errors=True)
            raise ChildFailed(f"cannot be run: no Python process for ONNX Runtime starts ({e.strerror or e})") from None
        self._finalizer = weakref.finalize(self, _kill, self.proc, home)
        for stream in (self.proc.stdin, self.proc.stdout):
            os.set_blocking(stream.fileno(), False)
        header = {"input": input_name, "threads": threads, "memory": memory or memory_cap()}
        self._ask(header, model, load_seconds, "loading the model", "cannot be loaded by ONNX Runtime")

    def run(self, batch: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        """The model's output for the float32 `batch`: WrongOutput unless it is float32 of `shape`."""
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        header, data = self._ask({"shape": list(batch.shape), "want": list(shape)}, batch.data, self.run_seconds,
                                 "running the model", "failed in ONNX Runtime", math.prod(shape) * 4)
        if header.get("dtype") != "float32" or header.get("shape") != list(shape):
            kind, dims = str(header.get("dtype"))[:40], str(header.get("shape"))[:80]
            raise WrongOutput(f"gave {kind} outputs of shape {dims}, not float32 logits of shape {list(shape)} "
                              f"({shape[0]} image(s), {shape[1]} classes)")
        return np.frombuffer(data, dtype=np.float32).reshape(shape).copy()  # writable: torch.from_numpy takes it

    def close(self) -> None:
        """End the child now (also done when the object is collected, and at exit)."""
        self._finalizer()

    def _ask(self, header: dict, payload: Any, seconds: float, doing: str, failed: str, answer_bytes: int = 0
             ) -> tuple[dict, bytes]:
        """Send one message and read the answer (its payload empty or `answer_bytes` long) within `seconds`;
        ChildFailed (the child killed) otherwise."""
        if not self._finalizer.alive:
            raise ChildFailed("cannot be run: ONNX Runtime's process has ended")
        deadline = time.monotonic() + seconds
        try:
            _send(self.proc.stdin.fileno(), header, payload, deadline)
            answer = _receive(self.proc.stdout.fileno(), deadline, answer_bytes)
        except TimeoutError:
            self.close()
            raise ChildFailed(f"did not finish {doing} within {seconds:g} s (a graph that runs for ever, or an "
                              "input far too big for it)") from None
        except (BrokenPipeError, EOFError, ConnectionResetError):
            raise ChildFailed(f"ended ONNX Runtime's process while {doing} ({self._ending()})") from None
        except ValueError:  # a header that is not JSON (not what this module's child sends)
            self.close()
            raise ChildFailed(f"made ONNX Runtime's process give an unreadable answer while {doing}") from None
        except BaseException:  # KeyboardInterrupt, a test's alarm...: the child never outlives the parent's wait
            self.close()
            raise
        if "error" in answer[0]:
            self.close()
            raise ChildFailed(f"{failed} ({_first_line(str(answer[0]['error']))})")
        return answer

    def _ending(self) -> str:
        """How the child ended (it is killed if it has not)."""
        try:
            code: Optional[int] = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self.close()
        if code is None:
            return "it stopped answering"
        if code == -signal.SIGKILL:  # what the kernel's out-of-memory killer sends
            return "killed by signal 9: it may need more memory than the machine has"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _kill(proc: subprocess.Popen, home: str) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        stream.close()
    shutil.rmtree(home, ignore_errors=True)


def _ready(selector: selectors.BaseSelector, deadline: float) -> None:
    """Return when the one file `selector` watches is ready; TimeoutError at the deadline."""
    left = deadline - time.monotonic()
    if left <= 0 or not selector.select(left):
        raise TimeoutError


def _send(fd: int, header: dict, payload: Any, deadline: float) -> None:
    """One message (a JSON header, the bytes of `payload`) written to the non-blocking `fd` by the deadline."""
    text = json.dumps(header).encode()
    payload = memoryview(payload).cast("B")
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_WRITE)
        for frame in (_LENGTH.pack(len(text)) + text + _LENGTH.pack(len(payload)), payload):
            view = memoryview(frame).cast("B")
            while view:
                _ready(selector, deadline)
                try:
                    view = view[os.write(fd, view[:1 << 20]):]
                except BlockingIOError:
                    continue


def _read(fd: int, n: int, deadline: float) -> bytes:
    """Exactly `n` bytes from the non-blocking `fd` by the deadline; EOFError if it ends first."""
    chunks, left = [], n
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while left:
            _ready(selector, deadline)
            try:
                chunk = os.read(fd, min(left, 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float, payload: int) -> tuple[dict, bytes]:
    """One answer: its JSON header (a mapping, at most MAX_HEADER bytes) and a payload of 0 or `payload` bytes."""
    size = _LENGTH.unpack(_read(fd, _LENGTH.size, deadline))[0]
    header = json.loads(_read(fd, size, deadline)) if size <= MAX_HEADER else None
    size = _LENGTH.unpack(_read(fd, _LENGTH.size, deadline))[0]
    if not isinstance(header, dict) or size not in (0, payload):
        raise EOFError  # not what this module's child sends: treated as its end
    return header, _read(fd, size, deadline)


def _first_line(text: str) -> str:
    """ONNX Runtime's message, first line, without its error-code prefix, source locations and C++ signatures."""
    text = (text.strip().splitlines() or ["no message"])[0]
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : (\w+) : ", r"\1: ", text)
    text = re.sub(r"Non-zero status code returned while running (\w+) node\. Name:'[^']*' Status Message: ",
                  r"\1 node: ", text)
    return re.sub(r"/\S+:\d+ [^()]*\(.*?\) ", "", text)[:300]


# The child's side.

def serve() -> None:
    """The child's main (run by OrtProcess): the model, then batches, from stdin; the answers on its stdout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it at once, even inside one long node
    _end_with_parent(int(sys.argv[2]))
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # whatever a library prints cannot corrupt the answers
    requests = sys.stdin.buffer
    header, model = _request(requests)
    _limit_memory(header["memory"])
    try:
        session = _session(model, header["threads"])
    except Exception as e:  # onnxruntime's InvalidGraph, InvalidProtobuf, NotImplemented, a failed allocation
        _answer(answers, {"error": (str(e) or type(e).__name__)[:2000]})
        return
    del model
    _answer(answers, {})
    name = header["input"]
    while (request := _request(requests)) is not None:
        header, data = request
        try:
            (out, *_) = session.run(None, {name: np.frombuffer(data, np.float32).reshape(header["shape"])})
        except Exception as e:  # a graph that fails on its declared input
            _answer(answers, {"error": (str(e) or type(e).__name__)[:2000]})
            continue
        described = {"dtype": str(out.dtype), "shape": list(out.shape)} if isinstance(out, np.ndarray) \
            else {"dtype": type(out).__name__, "shape": []}  # a sequence or map output
        ok = described == {"dtype": "float32", "shape": header["want"]}
        _answer(answers, {**described, "shape": described["shape"][:8]}, out.tobytes() if ok else b"")


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: errors are answered, not printed
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _request(stream: BinaryIO) -> Optional[tuple[dict, bytes]]:
    """(header, payload) from the parent, None at the end of its stream."""
    frames = []
    for _ in range(2):
        size = stream.read(_LENGTH.size)
        if len(size) < _LENGTH.size:
            return None
        frames.append(stream.read(_LENGTH.unpack(size)[0]))
    return json.loads(frames[0]), frames[1]


def _answer(stream: BinaryIO, header: dict, payload: bytes = b"") -> None:
    text = json.dumps(header).encode()
    stream.write(_LENGTH.pack(len(text)) + text + _LENGTH.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _limit_memory(cap: int) -> None:
    try:
        import resource
    except ImportError:  # not POSIX: the deadline still holds
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def _end_with_parent(parent: int) -> None:
    """End this process once its parent is gone (it would otherwise finish a long batch for no one)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
