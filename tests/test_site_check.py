"""tools.check_site finds what a reader would see broken (each check fails on a page that has the fault)."""

from pathlib import Path

from tools.check_site import page_findings, site_findings

GOOD = '<p>Fine <code>KL(p || q)</code> text.</p><span class="arithmatex">\\(x\\)</span>'
GOOD += '<script src="../javascripts/mathjax/tex-svg.js"></script>'


def test_a_clean_page_has_no_finding():
    assert page_findings("a.html", GOOD) == []


def test_each_fault_is_found():
    faults = {
        "Sphinx role": "<p>see :func:<code>policy_loss</code></p>",
        "escaped pipe": "<td>(1/\\|y\\|)</td>",
        "double backticks": "<p>the ``delta`` value</p>",
        "list inside a paragraph": "<p>Also worth knowing:\n* **At 3x** the rate</p>",
        "no MathJax": '<span class="arithmatex">\\(x\\)</span>',
        "doctest as quotes": "<blockquote>\n<blockquote>\n<p>round(1.5)</p></blockquote></blockquote>",
    }
    for what, page in faults.items():
        assert page_findings("a.html", page), what


def test_a_figure_that_does_not_open_larger_on_click_is_found():
    plain = '<p><img alt="x" src="figures/a.png"></p>'
    assert page_findings("a.html", plain) == ["a.html: 1 of its 1 figures do not open at full size on click"]
    linked = '<p><a class="glightbox" data-type="image" href="figures/a.png"><img alt="x" src="figures/a.png"></a></p>'
    assert page_findings("a.html", linked) == []


def test_code_blocks_are_not_checked():
    assert page_findings("a.html", "<pre><code>x = ``a`` :func:`b` \\|</code></pre>") == []


def test_an_unshown_figure_and_a_missing_bundle_are_found(tmp_path):
    site, docs = tmp_path / "site", tmp_path / "docs"
    (site / "api").mkdir(parents=True)
    (docs / "figures").mkdir(parents=True)
    (docs / "figures" / "a.png").write_bytes(b"png")
    (site / "index.html").write_text(GOOD)
    (site / "api" / "index.html").write_text("<p>no fields</p>")
    found = site_findings(site, docs)
    assert any("figures/a.png" in f for f in found)
    assert any("tex-svg.js" in f for f in found)
    assert any("divergence_delta" in f for f in found)
    (site / "javascripts" / "mathjax").mkdir(parents=True)
    (site / "javascripts" / "mathjax" / "tex-svg.js").write_text("")
    (site / "index.html").write_text(GOOD + '<a class="glightbox" href="figures/a.png"><img src="figures/a.png"></a>')
    fields = "".join(
        f"atr_llm.config.ATRGRPOConfig.{f} "
        for f in ("divergence_delta", "epsilon_low", "method_seed", "fast_generation")
    )
    (site / "api" / "index.html").write_text(fields)
    assert site_findings(site, docs) == []


def test_make_test_checks_the_site_it_builds():
    makefile = Path(__file__).resolve().parents[1].joinpath("Makefile").read_text()
    assert "tools.check_site" in makefile.split("\ntest:")[1].split("\n\n")[0]
