"""Tests of the study scripts in studies/ (their helpers and that each runs)."""
