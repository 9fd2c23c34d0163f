"""The viewer's pages, one module each; every page is ``draw(path, sig)`` (Compare also takes the runs' root).

The folder is ``views``, not ``pages``: Streamlit turns a ``pages/`` folder
beside the entry script into its own multipage navigation (a sidebar list
of every module, each a separate script), which this app routes itself.
"""
