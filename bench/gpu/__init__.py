"""The GPU check's sections and what they share; ``bench/gpu_check.py`` runs them in order.

Loading these modules imports only PyTorch, transformers and the standard library: the
``draftheads`` code under test (this checkout's ``conf``, ``heads`` and ``decode``, linked by the
script's bootstrap) is imported inside the functions that use it. The script imports this folder
as the package ``gpu`` from beside itself, so a bare GPU machine needs no installed
``draftheads``; installed, the same folder is ``draftheads.bench.gpu``. The modules import each
other relatively, so both names work.
"""
