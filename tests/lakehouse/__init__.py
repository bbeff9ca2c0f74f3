"""Tests of the lakehouse byte cache."""
