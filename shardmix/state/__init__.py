"""State: the checkpoint's format, below the stages that write it.

Its packings and versions (codec), the fields a loaded state must have (fields), every rank's
position in one state (ranks), and a state a trainer restored but never handed over (trainers).
"""
