"""Offline analysis of adtbench result directories."""
