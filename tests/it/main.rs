mod sim_github;
