"""One module per dashboard page; each is run by ``st.navigation`` after ``dashboard.app``."""
