"""The paper's Tables 2-3 and Figs. 3-4 at the scale of a 2-core CPU (Fig. 5, Pass@K against K, is read from the
samples its evaluations leave in ``--runs-dir`` by ``experiments.cpu_table.pass_at_k_curves``).

    python -m experiments.cpu_table                  # every run x 3 seeds, resumable (see the README for the cost)
    python -m experiments.cpu_table --device cuda --workers 8   # the same table on one GPU, 8 runs at a time
    python -m experiments.cpu_table --quick          # 2 runs x 1 seed x a few steps (CI)
    python -m experiments.cpu_table --at-step 250        # the table of 250-step runs, read from finished runs' checkpoints
    python -m experiments.cpu_table --learning-rate 3e-4 --max-steps 400 --save-steps 100         --runs clip atr atr-min clip-mask --runs-dir runs/cpu_table_lr3e-4 --out figures/cpu_table_lr3e-4
                                                     # another protocol: its own runs directory and table

Per seed: a tiny Qwen3 (``atr_llm.tiny``) gets a formatting SFT (600 steps) on three-term arithmetic answered
step by step (``a +- b +- c`` over digits, ``atr_llm.data.OFFLINE_TASKS["arithmetic-3step-steps"]``); then every
run of ``CPU_RUNS`` (Table 2's methods, Table 3's estimators and matched baselines, an ATR delta ablation)
trains GRPO from that same SFT model with ``atr_llm/configs/cpu-table.yaml`` (dr_grpo, G = 8, 32 prompts per step,
1,000 steps, ``num_iterations: 2`` so that clipping acts) through ``python -m atr_llm.train``'s own entry point.
Each run and the SFT model are evaluated on the task's test split (``atr_llm.data.is_held_out``: no training
row of any seed is a test problem) with 8 samples under two samplings, each its own benchmark of the table:
T = 0.3, top-p 0.95 (the paper's evaluation sampling) and T = 1 (the training sampling). Mean@8 and Pass@8 at
the final step and the best over the saved checkpoints, as in Table 2's "final (best)".

Writes into ``--out`` (default ``figures/``): ``cpu_llm_table.csv`` (one row per run x seed x benchmark),
``cpu_llm_table.md`` (means over seeds, paired differences against clip and atr with 95% t intervals, the
difference each line's seeds would detect with 80% power, and the seeds a comparison between rules needs at the
table's pooled spread: ``detectable_difference``, ``between_rule_noise``; when clip, clip-mask, atr-min
and atr ran on the same seeds, Eq. 5's form crossed with the ratio range as a 2 x 2: ``forms_factorial``;
training reward, entropy and length over each run's last 100 steps, paired: ``curve_tails``),
``cpu_llm_curves.csv`` + ``cpu_llm_curves.png`` (training reward, entropy, completion length: Fig. 3's
quantities), ``cpu_llm_delta_ablation.csv`` + ``.png`` (Mean@8 against ATR's delta: Fig. 4's question) and
``cpu_llm_table.json`` (settings, versions, paired statistics, each run's change from its own SFT model). Runs live in ``--runs-dir``; a finished run
(``result.json``) is not trained again, so an interrupted table resumes. The table in ``--out`` accumulates:
rows of an earlier invocation with the same protocol stay (a re-run (run, seed, SFT model) replaces its own), so
rows can be added by later invocations even when their ``--runs-dir`` is gone (``--replace-table`` starts over;
``--rewrite`` writes a table again from its own rows, training nothing, after a change to its statistics).

Every row records the SFT model it started from (``sft_model``: ``weights_id``, a hash of its weights) and
the invocation that wrote it. The same command trains different SFT models on different kinds of CPU (kernels
round differently and 600 steps amplify it), so rows are only paired when they started from the same model, and
SFT models trained on one kind of machine form one *start* (``start_labels``; each SFT model records the machine
that trained it, ``machine_kind``, so seeds added in a later invocation join their start); with more than one
start in a table every row is named with its start (``atr [B]``) and the table lists which models each start holds.


The modules: ``.protocol`` (runs, settings, layout), ``.driver`` (training and evaluation, the command
line), ``.statistics``, ``.report`` (tables, plots, files). Every name is re-exported here."""

from .driver import (  # noqa: F401
    _M_MMAP_THRESHOLD,
    _M_TOP_PAD,
    _M_TRIM_THRESHOLD,
    _seed_job,
    _send_output_to,
    _sft_and_evaluate,
    evaluate_every_benchmark,
    evaluate_model,
    evaluate_sft,
    keep_freed_memory,
    main,
    train_and_evaluate,
    train_sft,
    worker_init,
)
from .protocol import (  # noqa: F401
    _NOT_PRESETS,
    _PROTOCOL_KEYS,
    _RUN_PROTOCOL_KEYS,
    ABLATION_DELTAS,
    ACTED_KEYS,
    BASE_CONFIG,
    BENCHMARKS,
    CONTROLS,
    CPU_RUNS,
    CURVE_KEYS,
    DELTA_ABLATION,
    EVAL_SAMPLING,
    FORM_CONTROL,
    FULL,
    GROUP_SIZE,
    MACHINE_FILE,
    OFF_POLICY_KNOBS,
    PAPER_CLIP_HIGHER,
    QUICK,
    REGIME_KNOBS,
    TABLE2,
    TABLE3,
    TASK,
    TRUST_REGION_RULES,
    _result_of,
    _started_from,
    acted_summary,
    base_config_value,
    evaluation_problems,
    grpo_learning_rate,
    machine_kind,
    off_policy_knob,
    protocol_differences,
    refuse_other_protocol,
    regime_knob,
    result_at_step,
    run_args,
    run_directory,
    sft_machine,
    train_argv,
    weights_id,
)
from .report import (  # noqa: F401
    _number_or_none,
    _p_value,
    _table_order,
    _versions,
    difference_cell,
    markdown_comparison_validity,
    markdown_curve_tails,
    markdown_curves_equal,
    markdown_delta_optimum,
    markdown_forms_factorial,
    markdown_outcome_association,
    markdown_table,
    markdown_tables,
    masks_tokens,
    plot_curves,
    plot_delta_ablation,
    previous_outputs,
    read_table,
    read_tables_of_one_protocol,
    rewrite_outputs,
    sampling_label,
    write_outputs,
)
from .statistics import (  # noqa: F401
    ASSOCIATED_TAILS,
    FORMS_2X2_EFFECTS,
    REFERENCES,
    TAIL_KEYS,
    TAIL_STEPS,
    _by_benchmark_and_start,
    _of_start,
    _same_value,
    _table_row,
    _units,
    between_rule_noise,
    comparison_validity,
    contrast_values,
    curve_tail_differences,
    curve_tails,
    delta_ablation,
    delta_optimum,
    detectable_difference,
    display_name,
    equivalence_power,
    forms_factorial,
    grpo_minus_own_sft,
    holm_adjusted,
    mean_of_present,
    outcome_association,
    paired_against_references,
    paired_contrast,
    paired_difference,
    paired_equivalence,
    paired_t_power,
    pairing_key,
    pooled_sd,
    seeds_needed,
    start_labels,
    table_rows,
    unit_minus_reference,
    where_curves_part,
)
