"""What serving engines' drafter loaders read: the vocabulary of the rules (:mod:`.spec`) and the
checker every export passes before it is reported done (:mod:`.loaders`). Each kind writes its
own rules in its folder (``heads/<kind>/engine.py``).
"""
