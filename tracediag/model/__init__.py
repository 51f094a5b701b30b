"""The analytic model, beside the diagnosis: specs, software stack profiles (`stack.py`), kernel rates
(`rates.py`), memory and time, predict, plan, emit and calibrate (docs/model.md)."""
