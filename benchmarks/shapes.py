"""One shape of the benchmarks' generated shape tasks (`augment_policies`, `zoo_defaults`), drawn with Pillow."""

from __future__ import annotations

from PIL import ImageDraw

SHAPES = ("disc", "square", "triangle", "cross")


def draw_shape(d: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill) -> None:
    """`shape` (one of SHAPES) centred at (cx, cy), radius `r`, filled with `fill`."""
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "disc":
        d.ellipse(box, fill=fill)
    elif shape == "square":
        d.rectangle(box, fill=fill)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    elif shape == "cross":
        w = r / 3
        d.rectangle((cx - w, cy - r, cx + w, cy + r), fill=fill)
        d.rectangle((cx - r, cy - w, cx + r, cy + w), fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")
