"""``tools.site_layout`` measures what a reader's browser draws: a code block or table wider than its column is
found, one that fits is not (``make test`` runs it on the built site's first pages)."""

from __future__ import annotations

import shutil

import pytest

from tools.site_layout import page_layout

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium (apt-get install chromium)")

PAGE = """<html><body><article class="md-content__inner" style="width: 500px; font: 16px monospace">
<pre><code style="display: block; overflow: auto">{long}</code></pre>
<pre><code style="display: block; overflow: auto">short line</code></pre>
<div class="md-typeset__scrollwrap" style="overflow-x: auto"><table><tr>{cells}</tr></table></div>
<div class="md-typeset__scrollwrap" style="overflow-x: auto"><table><tr><td>a</td><td>b</td></tr></table></div>
</article></body></html>"""


def test_a_block_wider_than_its_column_is_found_and_one_that_fits_is_not(tmp_path):
    long = "x" * 120  # 120 monospace characters of 16 px: about 1,150 px in a 500 px column
    cells = "".join(f"<td>column_{i}_with_a_long_name</td>" for i in range(12))
    (tmp_path / "index.html").write_text(PAGE.format(long=long, cells=cells))
    found = page_layout(tmp_path, "index.html", width=800, height=600)
    assert found["column"] == 500
    kinds = sorted((f["kind"], f["first_line"][:12]) for f in found["overflowing"])
    assert kinds == [("pre", "x" * 12), ("table", "column_0_wit")], found
    assert all(f["content"] > f["box"] for f in found["overflowing"])
