"""Make the next batch's images on the GPU while this batch trains (`data.decode=device` on CUDA).

`DeviceBatch.to_images` decodes with nvJPEG, which returns only once its decode is done: called inside the step,
the host would wait there and the GPU would alternate decoding and training. `DevicePrefetcher` runs it one
batch ahead in a thread, on a side stream; the training stream waits for that batch's event (on the device, not
the host) before using it, and the tensors it hands over are recorded on the training stream (`record_stream`),
so the allocator never gives their memory to the next batch while training still reads it. The thread waits for
its stream before each decode (`_make`): nvJPEG does not order its writes after the stream's queued kernels. NVIDIA's DALI and apex's data_prefetcher do the same; both would be a dependency (and
DALI a second pipeline definition) for what is one thread and one stream here.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Iterator

import torch

from torchboost.data.device_decode import DeviceBatch

_END = object()


class DevicePrefetcher:
    """Iterates `loader`'s batches with each DeviceBatch's images already made on `device`, `depth` batches
    ahead. Everything else about the loader (len, sampler, set_epoch, batch_size, dataset) is the loader's."""

    def __init__(self, loader: Any, device: torch.device, depth: int = 2) -> None:
        self.loader, self.device, self.depth = loader, torch.device(device), depth

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # only called for what this class does not have
        return getattr(self.__dict__["loader"], name)

    def _make(self, batch: Any, stream: torch.cuda.Stream | None) -> tuple[Any, Any]:
        """(batch, event): the batch with its images made on the device, and the event they are done at."""
        if batch is None or not isinstance(batch[0], DeviceBatch):  # None: every image was a skipped corrupt one
            return batch, None
        x, y = batch
        if stream is not None:
            # The last batch's resize kernels may still wait on this stream, reading decoded images already freed
            # to the caching allocator; nvJPEG writes this batch's decode into the blocks it gets without waiting on
            # the stream (reported against torchvision's CUDA decode_jpeg), so those kernels must have run before
            # it decodes. This thread waits, not the training loop.
            stream.synchronize()
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            x.to_images(self.device)  # kept by the batch: prepare_input's x.to(device) returns it
            y = y.to(self.device, non_blocking=True)
            if stream is None:
                return (x, y), None
            done = torch.cuda.Event()
            done.record(stream)
        return (x, y), done

    def __iter__(self) -> Iterator[Any]:
        out: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():  # never blocks past the consumer's end
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                cuda = self.device.type == "cuda"
                if cuda:
                    torch.cuda.set_device(self.device)
                stream = torch.cuda.Stream(self.device) if cuda else None
                for batch in self.loader:
                    if not put(self._make(batch, stream)):
                        return
                put(_END)
            except BaseException as e:  # a corrupt image, a worker's death: raised where the batch is read
                put(e)

        thread = threading.Thread(target=work, name="torchboost-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, done = item
                if done is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(done)  # the device waits; the host goes on queueing
                    x, y = batch
                    for t in (x.to_images(self.device), y):  # made on the side stream, used on this one
                        t.record_stream(current)
                yield batch
        finally:
            stop.set()
            thread.join(timeout=10)
