"""The job path: one attempt of a job from its claim to its end.

``runner`` (claim, generate, fence, end) over ``prepare`` (the prompt as token ids),
``sampling`` (vLLM's request parameters), ``outputs`` (engine outputs -> stream events, a pure
unit), ``ending`` (the terminal state or the hand-back, persisted until Redis answers) and
``writer`` (every job's events, batched per engine step). Imports the engine layer only."""
