"""`streamlit run app.py` from a source checkout: the explorer's page lives in the package
(planner/app/page.py), which `planner app` serves directly."""
from planner.app.page import main

main()
