"""The package itself: its version, and where its own files are (templates, the notebooks, the story's
campaign, JupyterLab's config).

The modules that use them live in different layer folders; naming the folders once here keeps a move of a
module from silently pointing it at a folder that is not there.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CAMPAIGNS", "CONFIGS", "JUPYTER_CONFIG", "NOTEBOOKS", "PACKAGE_DIR", "TEMPLATES", "__version__"]

#: The package's version, as ``dsv4lab --version`` and every run's ``env.json`` report it.
__version__ = "0.1.0"

#: The installed package (``dsv4lab/``).
PACKAGE_DIR = Path(__file__).resolve().parent
#: Jinja templates: the campaign and sweep indexes, the nbconvert report template.
TEMPLATES = PACKAGE_DIR / "templates"
#: The experiment notebooks (a link to the repository's ``notebooks/``, the same files, in a checkout).
NOTEBOOKS = PACKAGE_DIR / "notebooks"
#: Campaign files shipped with the package (the story's ``story.toml``).
CAMPAIGNS = PACKAGE_DIR / "campaigns"
#: Config files shipped with the package (``vllm-cpu.toml``): a bare file name a notebook or ``--file`` gives
#: is looked up here when it is not a file where it is run.
CONFIGS = PACKAGE_DIR / "configs"
#: JupyterLab settings ``dsv4lab lab`` puts first on JUPYTER_CONFIG_PATH.
JUPYTER_CONFIG = PACKAGE_DIR / "jupyter_config"
