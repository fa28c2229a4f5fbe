"""Hydra's search path gets the ``conf`` folder of every adtbench plugin package (``adtbench.plugins.conf_dirs``).

Hydra discovers this ``SearchPathPlugin`` in the ``hydra_plugins`` namespace package, for every compose: the app
(``run.py``, ``adtbench``), the tools' ``compose_config`` and the pre-check. Each folder is appended after
adtbench's own ``conf/``, so ``policy=<a plugin's name>`` finds ``<plugin package>/conf/policy/<name>.yaml`` and a
plugin never shadows a shipped yaml. Reading the entry points imports no plugin code.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class AdtbenchPluginSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from adtbench.plugins import conf_dirs

        for conf in conf_dirs():
            search_path.append(provider="adtbench-plugin", path=f"file://{conf}")
