"""Helpers the tests share (importable as ``support.<module>``); no tests live here."""
