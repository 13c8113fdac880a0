"""atr-grpo in verl (0.9.1): the policy losses (``plugin``: ``atr_grpo_<method>``, registered by verl's
``verl.plugins`` entry point when ``import verl`` runs), the policy-loss config class with ``atr_params``
(``config``), the datasets and reward function (``data``), and the pieces verl lacks on a CPU (``cpu``, registered
only when ``cpu.register()`` is called: for smoke runs and this package's end-to-end test).

Importing this package imports nothing of verl.
"""
