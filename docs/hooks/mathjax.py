"""mkdocs hook: serve MathJax from the site itself (offline, no CDN).

The MathJax 3 SVG bundle (one self-contained file: fonts drawn as paths) comes from the ``django-static-mathjax``
package of the ``docs`` extra and is copied into the built site as ``javascripts/mathjax/tex-svg.js``, which
``extra_javascript`` in ``mkdocs.yml`` loads after ``javascripts/mathjax-config.js``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

BUNDLE = Path("static") / "mathjax" / "es5" / "tex-svg.js"
TARGET = Path("javascripts") / "mathjax" / "tex-svg.js"


def mathjax_bundle() -> Path:
    """The installed MathJax bundle; a clear error when the ``docs`` extra is missing."""
    try:
        import mathjax
    except ImportError:
        raise SystemExit(
            "the docs need MathJax from the package django-static-mathjax: pip install -e '.[docs]'"
        ) from None
    path = Path(mathjax.__file__).parent / BUNDLE
    if not path.is_file():
        raise SystemExit(f"no MathJax bundle at {path}: reinstall django-static-mathjax==3.2.2.1")
    return path


def on_post_build(config, **kwargs) -> None:
    target = Path(config["site_dir"]) / TARGET
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(mathjax_bundle(), target)
