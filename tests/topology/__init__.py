"""Tests of depthlens.topology (unit tier: synthetic arrays, no model)."""
