"""Several models on one worker (``INFERQ_MODELS``): a supervisor that follows the queue's demand
(``swapper``, ``policy``, ``demand``) and, in each model's process, its sleep and wake (``nap``,
``child``). docs/design.md, "Workers that follow demand"."""
