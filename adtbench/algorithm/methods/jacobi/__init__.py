"""The Jacobi family (SJD, SCD, GSD): ``loop`` holds the method and its math; the modules beside it are listed in
``adtbench.algorithm.methods``."""
