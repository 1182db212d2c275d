"""The integrations need their frameworks (the ``langgraph`` and ``agents`` extras, in ``dev``)."""
