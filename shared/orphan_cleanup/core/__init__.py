"""The pure core: the rules (classification, deletion, policy, evidence) and the data every
layer exchanges (models, messages, results, errors, settings). No I/O, no SDK, no clock;
nothing here imports the package outside ``core``."""
