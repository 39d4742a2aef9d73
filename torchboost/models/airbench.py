"""airbench's network (Keller Jordan's CIFAR-10 speedrun, github.com/KellerJordan/cifar10-airbench) for small images.

A 2x2 patch-whitening stem (`whiten`: 2·C·4 channels, unpadded, its weights set from the training images by
`init_whitening` and never trained), GELU, then three blocks of conv 3x3 -> max-pool 2 -> BatchNorm -> GELU
(pooling before the normalisation and activation does them on a quarter of the pixels: on a CPU, where those
memory-bound passes cost as much as the convolutions, that is most of the saving), a global max-pool and a
bias-free linear classifier (airbench's 1/9 logit scale is left out: under a mean loss at SGD's usual lrs it
slowed learning, 79% held-out top-1 after 2 epochs against 88% without). `convs` = 2 adds a second conv ->
BatchNorm -> GELU to each block, as airbench94 has. Widths: airbench94's 64/256/256 are sized for a GPU;
`airbench` (32/64/128, one conv a block) and `airbench_wide` (64/128/256) are sized for a CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from torchboost.errors import ConfigError

ARCHS = {"airbench": ((32, 64, 128), 1), "airbench_wide": ((64, 128, 256), 1)}
WHITEN_KERNEL = 2
BN_MOMENTUM = 0.4  # airbench's 0.6 in its convention (the share kept), torch's 0.4 (the share of the new batch)


def _block(cin: int, cout: int, convs: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.MaxPool2d(2),
                               nn.BatchNorm2d(cout, momentum=BN_MOMENTUM), nn.GELU()]
    for _ in range(convs - 1):
        layers += [nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout, momentum=BN_MOMENTUM),
                   nn.GELU()]
    return nn.Sequential(*layers)


class AirbenchNet(nn.Module):
    """See the module docstring. Images of at least 16 px: the stem and three halvings leave one pixel at 16."""

    def __init__(self, name: str = "airbench", num_classes: int = 10, in_chans: int = 3) -> None:
        super().__init__()
        widths, convs = ARCHS[name]
        stem = 2 * in_chans * WHITEN_KERNEL ** 2
        self.whiten = nn.Conv2d(in_chans, stem, WHITEN_KERNEL, bias=True)
        self.whiten.weight.requires_grad_(False)  # set from the data (`init_whitening`), then fixed
        self.act = nn.GELU()
        self.layers = nn.Sequential(*(_block(cin, cout, convs) for cin, cout in zip((stem, *widths), widths)))
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Linear(widths[-1], num_classes, bias=False)
        # the convs keep torch's default init, as airbench's do: He-normal (ReLU gain) ended 1 point lower on
        # Fashion-MNIST (fashion-speedrun, 8 epochs, 10,000 held-out images: 91.6% against 92.7%)
        nn.init.zeros_(self.whiten.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.layers(self.act(self.whiten(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


SMALLEST = 16  # px: the 2x2 stem leaves 15, three halvings 1


MAX_PATCHES = 1 << 22  # patches a whitening covariance is computed from (4M; a 224-px photo has 50,000)


class PatchCovariance:
    """The k×k patches' mean and covariance over batches of images, in float64, from at most MAX_PATCHES of
    them (each batch's patches thinned evenly once past the budget: photos have 50,000 patches an image)."""

    def __init__(self, channels: int, k: int) -> None:
        self.k, self.dim, self.count = k, channels * k * k, 0
        self.total = torch.zeros(self.dim, dtype=torch.float64)
        self.outer = torch.zeros(self.dim, self.dim, dtype=torch.float64)

    def add(self, images: Tensor) -> None:
        c, k = self.dim // self.k ** 2, self.k
        if images.ndim != 4 or images.shape[1] != c or min(images.shape[-2:]) < k:
            raise ConfigError(f"whitening needs N×{c}×H×W images of at least {k} px, got {tuple(images.shape)}",
                              "give it a batch of training images")
        per_image = (images.shape[-2] - k + 1) * (images.shape[-1] - k + 1)
        left = MAX_PATCHES - self.count
        if left <= 0:
            return
        images = images[:max(1, left // per_image)]
        patches = nn.functional.unfold(images.double().cpu(), k).transpose(1, 2).reshape(-1, self.dim)
        patches = patches[::max(1, -(-len(patches) // left))]
        self.total += patches.sum(0)
        self.outer += patches.T @ patches
        self.count += len(patches)

    def result(self) -> tuple[Tensor, Tensor]:
        if not self.count:
            raise ConfigError("no training image to set the whitening stem from", "give the run training images")
        mean = self.total / self.count
        return mean, self.outer / self.count - torch.outer(mean, mean)


@torch.no_grad()
def init_whitening(conv: nn.Conv2d, images: Tensor | PatchCovariance, eps: float = 5e-4) -> None:
    """Set `conv` (C -> 2·C·k², k×k, unpadded) to whiten the k×k patches of `images` (N×C×H×W, normalised as
    training sees them, or their `PatchCovariance`): its filters are the patch covariance's eigenvectors divided
    by the square roots of their eigenvalues (+ eps), and their negations, so the GELU after it passes both signs.
    airbench's `init_whitening_conv`, computed in float64."""
    c, k = conv.in_channels, conv.kernel_size[0]
    if conv.out_channels != 2 * c * k * k or conv.kernel_size != (k, k):
        raise ConfigError(f"a whitening conv needs {2 * c * k * k} {k}x{k} filters, this one has {conv.out_channels}",
                          "build the network's whitening stem with 2·C·k² output channels")
    if isinstance(images, Tensor):
        stats = PatchCovariance(c, k)
        stats.add(images)
        images = stats
    eigenvalues, eigenvectors = torch.linalg.eigh(images.result()[1])
    filters = (eigenvectors.T / (eigenvalues.clamp_min(0) + eps).sqrt()[:, None]).reshape(c * k * k, c, k, k)
    conv.weight.copy_(torch.cat([filters, -filters]).to(conv.weight))


def whitening_stem(model: nn.Module) -> nn.Conv2d | None:
    """The network's patch-whitening stem, if it has one."""
    stem = getattr(model, "whiten", None)
    return stem if isinstance(stem, nn.Conv2d) else None
