mod sim_talos;
