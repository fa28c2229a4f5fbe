"""The embedded project-trained model: the target from shipped weights (``target``) and the mini evaluator network
(``evaluator``, ``eval=mini``). This package imports none of them."""
