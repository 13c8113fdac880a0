"""A figure's smallest text, recorded when it is saved (``sims._common.png_text_metadata``), gives the height its
text is drawn at on screen (``tools.site_layout.figure_text_px``): checked against the pixels of the saved PNG."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from sims._common import DPI_KEY, SMALLEST_TEXT_KEY, save_figure, smallest_text_pt  # noqa: E402
from tools.site_layout import figure_text_px  # noqa: E402


def _ink_rows(path) -> int:
    """Rows of the PNG holding dark pixels (the one glyph drawn): its height in pixels, read from the image."""
    pixels = np.asarray(Image.open(path).convert("L"))
    return int((pixels < 128).any(axis=1).sum())


@pytest.mark.parametrize("size_pt, dpi", [(7, 110), (12, 100), (20, 72)])
def test_the_recorded_text_size_is_the_height_the_glyphs_are_drawn_at(tmp_path, size_pt, dpi):
    """One capital H of ``size_pt`` points alone on a figure drawn at ``dpi``: DejaVu Sans's capital height is 0.729 of its
    em (its font metrics), so the ink the PNG holds is 0.729 x the em in pixels that ``figure_text_px`` gives for the
    image shown at its own width, to a pixel; shown at half its width, half of it."""
    fig = plt.figure(figsize=(2, 1), dpi=dpi)
    fig.text(0.5, 0.5, "H", fontsize=size_pt, family="DejaVu Sans", ha="center", va="center")
    assert smallest_text_pt(fig) == size_pt
    (png, _) = save_figure(fig, tmp_path, "one_glyph")
    with Image.open(png) as image:
        saved_dpi = image.info["dpi"][0]  # savefig's resolution (sims' style: savefig.dpi 200), not the figure's
        assert image.text[SMALLEST_TEXT_KEY] == f"{size_pt:g}" and float(image.text[DPI_KEY]) == round(saved_dpi)
        width = image.size[0]
    page = tmp_path / "page.html"
    em = figure_text_px(tmp_path, page.name, {"src": png.name, "natural": width, "shown": width})
    assert abs(0.729 * em - _ink_rows(png)) <= 1.5
    half = figure_text_px(tmp_path, page.name, {"src": png.name, "natural": width, "shown": width // 2})
    assert half == pytest.approx(em * (width // 2) / width)


def test_the_smallest_text_is_the_smallest_drawn_and_a_figure_without_size_says_so(tmp_path):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.legend(fontsize=6)
    ax.tick_params(labelsize=11)
    ax.set_title("title", fontsize=14)
    assert smallest_text_pt(fig) == 6
    plt.close(fig)
    bare = plt.figure(figsize=(1, 1))
    bare.savefig(tmp_path / "bare.png")
    plt.close(bare)
    assert figure_text_px(tmp_path, "page.html", {"src": "bare.png", "natural": 100, "shown": 100}) is None
