"""Figures go to disk as palette PNGs that keep the plot: the same size in pixels, a palette of
at most 64 colours, and the plotted colours still there."""

from __future__ import annotations

from pathlib import Path


def test_save_png_writes_a_small_palette_image_of_the_figure(tmp_path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    from horizonrl.cluster.ops.png import COLOURS, save_png

    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for k in range(5):
        ax.plot(range(50), [(i * (k + 1)) % 17 for i in range(50)], label=f"line {k}")
    ax.legend()
    save_png(fig, tmp_path / "q.png", dpi=100)
    fig.savefig(tmp_path / "full.png", dpi=100)
    q, full = Image.open(tmp_path / "q.png"), Image.open(tmp_path / "full.png")
    assert q.mode == "P" and q.size == full.size == (400, 300)
    assert len(q.getcolors(maxcolors=256)) <= COLOURS
    assert (tmp_path / "q.png").stat().st_size < (tmp_path / "full.png").stat().st_size
    # Matplotlib's first line colour (C0, #1f77b4) survives quantisation, near enough.
    rgb = {c for _, c in q.convert("RGB").getcolors(maxcolors=256)}
    assert any(sum(abs(a - b) for a, b in zip(c, (0x1F, 0x77, 0xB4))) < 30 for c in rgb)
