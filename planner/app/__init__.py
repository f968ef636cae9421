"""The Streamlit what-if explorer over the same core (`planner app`)."""
