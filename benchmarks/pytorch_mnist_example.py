"""What a PyTorch user runs instead of torchboost: the official MNIST example (pytorch/examples, mnist/main.py),
written here from its description and pointed at Fashion-MNIST, for `benchmarks/fashion_speedrun.py`'s side by side.

As the example has it: the two-conv CNN (conv 1->32 and 32->64, 3x3; max-pool 2; dropout 0.25; fc 9216->128;
dropout 0.5; fc 128->10; log-softmax), NLL loss, Adadelta at lr 1.0, StepLR with gamma 0.7 every epoch, 14 epochs,
batch 64 (1,000 to test), seed 1, its transform ToTensor + Normalize((0.1307,), (0.3081,)) applied image by image,
the test split evaluated after every epoch, and on a CPU its DataLoader keyword arguments (shuffle, workers and
pinned memory are only set for an accelerator: on the CPU the training order is the file's, every epoch). The one
change: torchvision cannot be imported here (its wheels are CUDA builds), so the dataset reads the same IDX files
with gzip and numpy and makes each sample as torchvision's FashionMNIST does (a PIL image, then the transform).

Prints one JSON line per epoch: {"epoch", "seconds" (wall since the script started, data loading included),
"test_accuracy"}; the last line also has "total_seconds".

    .venv/bin/python benchmarks/pytorch_mnist_example.py --data /usr/share/datasets/fashion-mnist
"""

from __future__ import annotations

import time

START = time.perf_counter()  # the whole command is timed, as a user's stopwatch would

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn, optim  # noqa: E402
from torch.optim.lr_scheduler import StepLR  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped): its big-endian header, then uint8 data."""
    raw = gzip.decompress(path.read_bytes())
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


class IdxImages(Dataset):
    """torchvision's FashionMNIST, as it makes a sample: a PIL image of the row, then the transform."""

    def __init__(self, root: Path, train: bool) -> None:
        prefix = "train" if train else "t10k"
        self.images = read_idx(root / f"{prefix}-images-idx3-ubyte.gz")
        self.labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = Image.fromarray(self.images[i], mode="L")
        x = torch.from_numpy(np.array(image, np.float32) / 255.0).unsqueeze(0)  # ToTensor
        return (x - 0.1307) / 0.3081, int(self.labels[i])  # Normalize((0.1307,), (0.3081,))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def train(model: nn.Module, loader: DataLoader, optimizer: optim.Optimizer, epoch: int, log_interval: int) -> None:
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % log_interval == 0:  # the example's progress line (to stderr here: stdout is the JSON)
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\tLoss: {loss.item():.6f}",
                  file=sys.stderr)


def test(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int((output.argmax(dim=1) == target).sum())
    print(f"Test set: Average loss: {test_loss / len(loader.dataset):.4f}, Accuracy: {correct}/{len(loader.dataset)}",
          file=sys.stderr)
    return correct / len(loader.dataset)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder of the four IDX .gz files")
    ap.add_argument("--epochs", type=int, default=14)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-interval", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    root = Path(args.data)
    train_loader = DataLoader(IdxImages(root, train=True), batch_size=64)
    test_loader = DataLoader(IdxImages(root, train=False), batch_size=1000)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        train(model, train_loader, optimizer, epoch, args.log_interval)
        row = {"epoch": epoch, "seconds": round(time.perf_counter() - START, 2),
               "test_accuracy": test(model, test_loader)}
        scheduler.step()
        if epoch == args.epochs:
            row["total_seconds"] = round(time.perf_counter() - START, 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
