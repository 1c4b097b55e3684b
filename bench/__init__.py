"""draftheads.bench: the benchmark room (the end-to-end pipeline, decoding, training and data speed).

Each benchmark is a ``draftheads`` command (``bench``, ``demo``, ``speed``, ``train-speed``,
``data-speed``) or a ``make`` target; nothing here is imported by the library's lower layers.
"""
