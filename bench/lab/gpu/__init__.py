"""The GPU check's sections and what they share; ``bench/lab/gpu_check.py`` runs them in order.

Loading these modules imports only PyTorch, transformers and the standard library: the
``draftheads`` code under test (this checkout's ``conf``, ``heads`` and ``decode``, as the
check's bootstrap maps them) is imported inside the functions that use it. The modules import
each other relatively, as the package ``bench.lab.gpu`` of a checkout.
"""
