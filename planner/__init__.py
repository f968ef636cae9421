"""LLM training planner: an analytical cost model for layout, memory, step time and cost.

Importing ``planner`` loads nothing heavy (no torch, matplotlib or streamlit) and reads no files.
"""

__version__ = "0.1.0"
