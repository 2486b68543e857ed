"""Figures saved as palette PNGs: a plot of lines and bars needs few colours, and 64 of them
make a file about a third of matplotlib's RGBA one (docs/ keeps 28 of them under a size limit)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

COLOURS = 64


def save_png(fig: Any, path: Path | str, *, dpi: int) -> None:
    """Render matplotlib `fig` at `dpi` and write it to `path` with a 64-colour palette."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    buf.seek(0)
    image = Image.open(buf).convert("RGB")
    image.quantize(colors=COLOURS, method=Image.Quantize.MEDIANCUT).save(
        path, format="PNG", optimize=True)
