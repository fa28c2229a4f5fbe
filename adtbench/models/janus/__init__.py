"""Janus-Pro (transformers 4.57's ``JanusForConditionalGeneration`` layout): the lean static-cache network (``lean``),
the targets and builder (``target``), the VQ decoder (``vq``) and the tiny checkpoint writer (``tiny``). Import the
module you need: this package imports none of them."""
