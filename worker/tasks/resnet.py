"""ResNet backbones for the ``swav`` task, laid out as torchvision's (``torchvision.models.resnet``) so that a trained
backbone's state dict loads into ``torchvision.models.resnet18()`` or ``resnet50()`` (whose ``fc`` is set to
``torch.nn.Identity()``: the backbone ends at the pooled features).

- ``tiny``: BasicBlocks [1, 1, 1, 1] of widths 16-128 with a 3x3 stem and no max-pool, for 32-pixel images on a
  CPU (the demo and the tests).
- ``resnet18`` (BasicBlocks [2, 2, 2, 2]) and ``resnet50`` (Bottlenecks [3, 4, 6, 3]), widths 64-512: torchvision's.

swarmhub does not depend on torchvision: a volunteer's torch and torchvision must be built for each other, and a
mismatched pair fails at import, so the worker carries these few layers itself.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _shortcut(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


def _shortcut(inplanes: int, outplanes: int, stride: int) -> nn.Module | None:
    if stride == 1 and inplanes == outplanes:
        return None
    return nn.Sequential(nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes))


class ResNet(nn.Module):
    """Images (N, 3, H, W) to pooled features (N, ``num_features``)."""

    def __init__(
        self, block: type[BasicBlock | Bottleneck], layers: list[int], widths: tuple[int, ...], small_images: bool
    ):
        super().__init__()
        self.inplanes = widths[0]
        if small_images:
            self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool: nn.Module = nn.Identity() if small_images else nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(block, widths[0], layers[0], 1)
        self.layer2 = self._layer(block, widths[1], layers[1], 2)
        self.layer3 = self._layer(block, widths[2], layers[2], 2)
        self.layer4 = self._layer(block, widths[3], layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Identity()
        self.num_features = widths[3] * block.expansion
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def _layer(self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = [block(self.inplanes, planes, stride)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


ARCHITECTURES: dict[str, tuple[type[BasicBlock | Bottleneck], list[int], tuple[int, ...], bool]] = {
    "tiny": (BasicBlock, [1, 1, 1, 1], (16, 32, 64, 128), True),
    "resnet18": (BasicBlock, [2, 2, 2, 2], (64, 128, 256, 512), False),
    "resnet50": (Bottleneck, [3, 4, 6, 3], (64, 128, 256, 512), False),
}


def build_backbone(name: str) -> ResNet:
    """A freshly initialised backbone: ``tiny``, ``resnet18`` or ``resnet50``."""
    block, layers, widths, small = ARCHITECTURES[name]
    return ResNet(block, layers, widths, small)
