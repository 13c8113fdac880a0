"""What every sims/ script shares: the command line, figure style, and writing figures with their numbers."""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "savefig.dpi": 200,
        # text of at least 9 px on the site's ~1,000 px column: a figure W inches wide is shown at 998 / W px per
        # inch, so its smallest text needs 9 * 72 / 998 * W pt (11 pt up to 16.9 in; tools.site_layout --figures)
        "font.size": 12,
        "axes.titlesize": 12,
        "axes.labelsize": 12,
        "xtick.labelsize": 11,
        "ytick.labelsize": 11,
        "legend.fontsize": 11,
        "axes.grid": True,
        "grid.alpha": 0.3,
    }
)


def parse_args(
    doc: str, argv: Sequence[str] | None = None, extra=None, check=None, *, seed: bool = True
) -> argparse.Namespace:
    """``--quick`` (small, < 1 min, for CI), ``--seed`` (``seed=False``: not declared, for a script that draws
    nothing, so ``--seed`` is refused as an unknown option instead of being ignored), ``--out`` (default
    figures/paper/)."""
    from atr_llm.cli_types import SEED, WriteDir
    from atr_llm.command_line import Parser

    ap = Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small version that runs in well under a minute")
    if seed:
        ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--out", type=WriteDir(), default="figures/paper", help="output folder (default: figures/paper/)")
    if extra:
        extra(ap)
    args = ap.parse_args(argv)
    if check:
        check(args)  # the script's own arguments, refused before the output folder is made
    args.out = Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


SMALLEST_TEXT_KEY = "Smallest text (pt)"
"""The PNG text entry that records a figure's smallest font size in points (``png_text_metadata``), beside
``DPI_KEY``: with the width a page shows the image at, the height of its smallest text on screen
(``tools.site_layout``)."""
DPI_KEY = "Dots per inch"


def smallest_text_pt(fig) -> float | None:
    """The smallest font size, in points, of the figure's drawn text that is not empty (titles, axis and tick labels,
    legends, annotations); None for a figure without text. Drawn first: tick labels exist once drawn."""
    from matplotlib.text import Text

    fig.canvas.draw()
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) if sizes else None


def png_text_metadata(fig, dpi: float | None = None) -> dict[str, str]:
    """PNG text entries recording the smallest text (``SMALLEST_TEXT_KEY``) and the resolution the PNG is saved at
    (``DPI_KEY``; default what ``savefig`` uses: ``savefig.dpi``, or the figure's where that says ``figure``): its
    smallest text is ``pt * dpi / 72`` pixels high in the file."""
    pt = smallest_text_pt(fig)
    if dpi is None:
        saved = plt.rcParams["savefig.dpi"]
        dpi = fig.dpi if saved == "figure" else float(saved)
    return {} if pt is None else {SMALLEST_TEXT_KEY: f"{pt:g}", DPI_KEY: f"{dpi:g}"}


def legend_below(ax, *args, ncol: int = 2, **kwargs):
    """The panel's legend under it, below its x-axis label, without a frame: it covers no curve (``tight_layout`` and
    ``bbox_inches='tight'`` make room for it)."""
    return ax.legend(*args, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=ncol, frameon=False, **kwargs)


def save_figure(fig, out: Path, name: str) -> list[Path]:
    """Write ``name.png`` (with ``png_text_metadata``) and ``name.pdf`` into ``out``; close the figure."""
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    fig.tight_layout()
    fig.savefig(paths[0], bbox_inches="tight", metadata=png_text_metadata(fig))
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None})  # same numbers, same bytes
    plt.close(fig)
    return paths


def write_csv(path: Path, rows: Iterable[dict]) -> Path:
    """Rows of dicts -> CSV; the columns are the union of the keys, in order of first appearance."""
    rows = list(rows)
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1, default=float))
    return path


def mean_ci(x: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and a 95% normal-approximation confidence band (1.96 standard errors) along ``axis``."""
    x = np.asarray(x, dtype=float)
    m = x.mean(axis)
    se = x.std(axis, ddof=1) / np.sqrt(x.shape[axis]) if x.shape[axis] > 1 else np.zeros_like(m)
    return m, m - 1.96 * se, m + 1.96 * se


def method_color(name: str) -> str:
    """A fixed colour per registered method: ``tab20`` by registration order (every method has one, new ones too)."""
    import atr_theory as at

    canonical = list(dict.fromkeys(spec.name for spec in at.METHODS.values()))
    index = canonical.index(at.get_method(name).name)
    return matplotlib.colors.to_hex(plt.get_cmap("tab20")(index % 20))


def zipf_bandit_task(quick: bool, seed: int):
    """The many-armed bandit of entropy_diff.py and bandit_training.py: Zipf initial policy per (seed, state),
    reward 1 on 5 random arms per state. Returns (theta0, rewards, settings)."""
    import torch

    from atr_theory import bandit

    N, S, K = (3, 2, 100) if quick else (16, 8, 1000)
    settings = {
        "N": N,
        "S": S,
        "K": K,
        "iterations": 30 if quick else 300,
        "inner_steps": 4,
        "group_size": 16,
        "lr": 20.0,
        "advantage": "dr_grpo",
        "mode": "sampled",
    }
    gen = torch.Generator().manual_seed(seed)
    theta0 = bandit.zipf_logits(N, S, K, generator=gen)
    r = torch.zeros(S, K, dtype=torch.float64)
    for s in range(S):
        r[s, torch.randperm(K, generator=gen)[:5]] = 1.0
    return theta0, r, settings


MASK_FORM_RULES = ("atr", "kl1", "kl2", "is_kl3", "tr_ppo")
"""Rules these figures train in the mask form (the Section 4 pure-clip objective; ``atr_theory.READINGS``) where no
form is asked for, as the committed figures were drawn; ``run_label`` names the form on every figure and in every
table."""


def figure_form(method: str) -> str:
    """The form a figure trains ``method`` in when none is given: ``"mask"`` for ``MASK_FORM_RULES``, else the
    rule's default."""
    import atr_theory as at

    return "mask" if method in MASK_FORM_RULES else at.get_method(method).default_form


def run_label(method: str, form: str | None = None) -> str:
    """``method`` labelled by its form where the rule has two: ``"atr (mask)"``, ``"clip (min)"``."""
    import atr_theory as at

    form = form or figure_form(method)
    return f"{method} ({form})" if len(at.get_method(method).forms) > 1 else method


def run_zipf_bandit(theta0, r, settings, method: str, seed: int, **params):
    """Train one method on the Zipf task; the same sampling seed for every method (paired comparisons); the form is
    ``figure_form(method)`` unless ``params`` names one."""
    import torch

    from atr_theory import bandit

    params.setdefault("form", figure_form(method))

    keys = ("iterations", "inner_steps", "group_size", "lr", "advantage", "mode")
    return bandit.train(
        r, theta0, method, generator=torch.Generator().manual_seed(seed + 1), **{k: settings[k] for k in keys}, **params
    )


def train_adam_zipf(theta0, r, base: dict, method: str, lr: float, inner: int, seed: int, **params):
    """Train ``method`` on the Zipf task with Adam (delta_sweep.py, range_form.py): ``base``'s iterations and group
    size, sampled Dr.GRPO advantages, ``inner`` Adam steps of rate ``lr`` per sampled batch; the same samples' seed
    for every method and parameter (paired comparisons). Returns the ``TrainHistory``."""
    import torch

    from atr_theory import bandit

    _, history = bandit.train(
        r,
        theta0,
        method,
        iterations=base["iterations"],
        inner_steps=inner,
        lr=lr,
        mode="sampled",
        group_size=base["group_size"],
        advantage="dr_grpo",
        optimizer="adam",
        generator=torch.Generator().manual_seed(seed + 1),
        **params,
    )
    return history
