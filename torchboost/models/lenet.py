"""The MNIST CNN of the PaddlePaddle beginner tutorial (`MNIST` class, "LeNet" in the docs).

conv 20@5x5 pad 2 + ReLU, max-pool 2, conv 20@5x5 pad 2 + ReLU, max-pool 2, linear -> classes.
For 28x28 inputs the linear layer sees 20*7*7 = 980 features; other sizes are computed here.
"""

from __future__ import annotations

import torch
from torch import nn

from torchboost.errors import ConfigError
from torchboost.models.init import init_mnist_cnn


class MnistCNN(nn.Module):
    def __init__(self, num_classes: int = 10, in_chans: int = 1, image_size: int = 28,
                 init: str = "paddle") -> None:
        super().__init__()
        if image_size < 4:
            raise ConfigError(f"MNIST CNN needs images of at least 4 px, got {image_size}",
                              "set data.image_size >= 4")
        self.conv1 = nn.Conv2d(in_chans, 20, 5, padding=2)
        self.conv2 = nn.Conv2d(20, 20, 5, padding=2)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        side = image_size // 2 // 2  # padding 2 keeps the size through each 5x5 conv; each pool halves it
        self.fc = nn.Linear(20 * side * side, num_classes)
        init_mnist_cnn(self, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))
