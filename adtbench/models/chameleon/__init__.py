"""Chameleon-family targets: Anole (``target``), Lumina-mGPT (``lumina``), the lean Chameleon LM (``lean``), the
Chameleon VQGAN (``vq``) and the tiny checkpoint writers (``tiny``). Import the module you need: this package
imports none of them."""
